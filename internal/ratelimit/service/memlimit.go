package service

import (
	"errors"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// applyMemoryLimit sets the Go runtime's soft memory limit to ratio x the
// memory limit provider reports (the container's cgroup limit in the
// service), unless GOMEMLIMIT is set or ratio is 0. The service runs with
// GC_PERCENT=400 for throughput, which lets the heap reach five times the
// live counters between collections; near a pod's memory limit that is an
// OOM kill, and an OOM kill of the embedded store loses the snapshot
// interval's charges. With the limit set, the collector runs as often as it
// must to stay under it instead. It returns the limit in force and whether
// this call set it; no limit reported (a process outside a container) is
// not an error and sets nothing.
func applyMemoryLimit(ratio float32, getenv func(string) string, provider memlimit.Provider) (int64, bool, error) {
	before := debug.SetMemoryLimit(-1)
	if ratio <= 0 || getenv("GOMEMLIMIT") != "" {
		return before, false, nil
	}
	limit, err := provider()
	if errors.Is(err, memlimit.ErrNoLimit) {
		return before, false, nil
	}
	if err != nil {
		return before, false, err
	}
	// cgroup v1 says "no limit" with a huge number (2^63 rounded down to a
	// page) rather than an error; no machine has 4 EiB.
	if limit >= 1<<62 {
		return before, false, nil
	}
	soft := uint64(float64(limit) * float64(ratio))
	if soft == 0 || soft >= uint64(before) {
		return before, false, nil
	}
	debug.SetMemoryLimit(int64(soft))
	return int64(soft), true, nil
}
