package valkey

import (
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
)

// stallGuard tells when Valkey has answered nothing for a while since a call
// was sent to it (a stalled server: SIGSTOP, a long fork, a partition that
// drops without resetting), so new calls are buffered instead of being sent
// into the stall, where they would wait (the ring full) and then be
// ambiguous. Times are monotonic ns since epoch: a wall-clock step must not
// wedge the guard.
type stallGuard struct {
	after time.Duration // <= 0: off
	epoch time.Time
	// unansweredSince is when the first call sent since Valkey's last
	// answer was sent (0: none, or answered since); lastProbe when the last
	// probe was let through a stall.
	unansweredSince, lastProbe atomic.Int64
}

// mono is the monotonic time since the guard was made, in ns (never 0).
func (g *stallGuard) mono() int64 { return int64(time.Since(g.epoch)) + 1 }

// sent records that a call is being sent.
func (g *stallGuard) sent() {
	if g.unansweredSince.Load() == 0 {
		g.unansweredSince.CompareAndSwap(0, g.mono())
	}
}

// answered records that Valkey answered.
func (g *stallGuard) answered() { g.unansweredSince.Store(0) }

// stalled reports whether Valkey has answered nothing for g.after since a
// call was sent to it, and for how long. One call per g.after is let
// through a stall as a probe: its answer ends the stall.
func (g *stallGuard) stalled() (time.Duration, bool) {
	u := g.unansweredSince.Load()
	if g.after <= 0 || u == 0 {
		return 0, false
	}
	now := g.mono()
	since := time.Duration(now - u)
	if since <= g.after {
		return since, false
	}
	if last := g.lastProbe.Load(); now-last >= int64(g.after) && g.lastProbe.CompareAndSwap(last, now) {
		return since, false // the probe
	}
	return since, true
}

// answered reports whether Valkey answered any command of a call: a value
// or an error reply. Calls failed by the client (a torn-down connection, a
// timeout, a refused dial) do not count: one connection of a stalled server
// being torn down must not let new calls into the others.
func answered(res []valkey.ValkeyResult) bool {
	for _, r := range res {
		err := r.Error()
		if err == nil || valkey.IsValkeyNil(err) {
			return true
		}
		if _, ok := valkey.IsValkeyErr(err); ok {
			return true
		}
	}
	return false
}
