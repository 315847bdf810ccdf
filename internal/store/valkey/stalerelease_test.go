package valkey

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// losingClient passes calls to a real Valkey, except while lose is set: then
// it sends nothing and answers each call as timed out (maybe applied, for
// the store).
type losingClient struct {
	valkey.Client
	lose atomic.Bool
}

func (c *losingClient) DoMulti(ctx context.Context, cmds ...valkey.Completed) []valkey.ValkeyResult {
	if c.lose.Load() {
		return errResults(len(cmds), context.DeadlineExceeded)
	}
	return c.Client.DoMulti(ctx, cmds...)
}

// TestReleaseReplayedAfterItsHoldExpired: a charge's hold release that waits
// in the outage buffer (or in a kept, unanswered call) longer than a hold
// lives releases nothing of its own request: that hold has expired. A
// release takes the counter's oldest hold, so replayed then it took the hold
// of a request admitted after Valkey came back, and the next check was
// admitted past the cap (security.md section 4's bound). Cap 8, reserve 5:
// A holds, A's charge of 3 waits through an outage longer than the holds'
// expiry, B holds after it (A's hold found expired), A's charge is
// replayed; C sees 3 used and B's 5 held, 8 >= 8, and must be denied.
func TestReleaseReplayedAfterItsHoldExpired(t *testing.T) {
	for _, kept := range []bool{false, true} {
		name := map[bool]string{false: "buffered", true: "kept unanswered"}[kept]
		t.Run(name, func(t *testing.T) {
			srv := valkeytest.Start(t, valkeytest.Options{})
			var clock atomic.Int64
			clock.Store(time.Now().UnixNano())
			lc := &losingClient{Client: realClient(t, srv.Addr)}
			s := storeOver(t, lc, Options{Addresses: []string{srv.Addr}, ReplayInterval: time.Hour, StallAfter: -1,
				Now: func() time.Time { return time.Unix(0, clock.Load()) }})
			window := time.Now().Add(time.Hour).Unix()
			hold, exp := store.Hold{Expiry: 10 * time.Second, Window: window}, time.Unix(window, 0)
			check := func(who string) store.Result {
				t.Helper()
				h := hold
				h.Reserve = 5
				cs := []store.Counter{{Key: "k", ExpireAt: exp, Start: true, Limit: 8, Enforce: true, Hold: h}}
				rs := make([]store.Result, 1)
				if err := s.Charge(context.Background(), cs, rs); err != nil {
					t.Fatalf("check %s: %v", who, err)
				}
				return rs[0]
			}
			if r := check("A"); !r.Held {
				t.Fatalf("A: %+v, want held", r)
			}
			h := hold
			h.Release = 1
			charge := []store.Counter{{Key: "k", Hits: 3, ExpireAt: exp, Hold: h}}
			if kept {
				lc.lose.Store(true)
				_ = s.Charge(context.Background(), charge, make([]store.Result, 1)) // unanswered: kept under its id
				lc.lose.Store(false)
			} else {
				s.Defer(charge) // its deadline passed before it was sent: buffered
			}
			clock.Add(int64(11 * time.Second)) // longer than any hold lives
			if r := check("B"); !r.Held || r.Expired != 5 {
				t.Fatalf("B: %+v, want held, A's 5 tokens found expired", r)
			}
			for s.Stats().BufferKeys > 0 {
				if !s.replayOnce() {
					t.Fatalf("replay failed: %+v", s.Stats())
				}
			}
			if r := check("C"); r.Held || r.Total != 3 || r.Reserved != 5 {
				t.Errorf("C: %+v; want denied with 3 used and B's 5 held: A's late release took B's hold", r)
			}
			y := s.Tally()
			dropped := map[bool]store.Class{false: store.Expired, true: store.AmbiguousDropped}[kept]
			if got, _ := srv.Do("GET", "k"); got != "3" || y.Get(store.TargetRelease, dropped) != 1 || y.Waiting(store.TargetRelease) != 0 {
				t.Errorf("GET k = %s, want 3 (A's hits still count); releases: %s, want the 1 %s", got, classes(y, store.TargetRelease), dropped)
			}
		})
	}
}
