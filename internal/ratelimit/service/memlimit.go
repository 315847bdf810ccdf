package service

import (
	"errors"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"

	"github.com/budgetgen/budgetgen/internal/ratelimit/settings"
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

// embeddedByteBound is the embedded store's byte bound when MEMORY_MAX_BYTES
// is unset: settings.DefaultMemoryMaxBytes, or half the Go soft memory limit
// when that is lower. A 256 MiB pod would otherwise be OOM-killed before its
// store reached the default bound (and an OOM kill loses the snapshot
// interval's charges); half leaves the collector room for the heap's growth
// between collections, the snapshot's writes and the requests in flight.
func embeddedByteBound(softLimit int64) int {
	if softLimit > 0 && softLimit/2 < settings.DefaultMemoryMaxBytes {
		return int(softLimit / 2)
	}
	return settings.DefaultMemoryMaxBytes
}
