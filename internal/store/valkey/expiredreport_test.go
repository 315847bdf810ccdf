package valkey

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// TestReplayedReleaseReportsExpiredHolds: a release that reaches Valkey
// through the outage buffer (or as a kept, unanswered call) can find the
// counter's older holds expired, like any release; the reply says so
// (Result.Expired) but nobody waits for it, and settleReplay discarded it,
// so ratelimit_reservation_expired_tokens_total missed those tokens. The
// store must hand them to its ReportExpired func with the counter's
// Hold.Owner, once, and never for a call answered to its caller (whose
// result carries them). Holds live 10 s (two 5 s generations): A holds 5 at
// 0 s, B holds 3 at 6 s (A's generation is then the older one), B's charge
// is sent at 7 s and waits; replayed at 11 s, its release finds A's 5
// tokens expired and takes B's hold.
func TestReplayedReleaseReportsExpiredHolds(t *testing.T) {
	for _, path := range []string{"buffered", "kept unanswered", "answered"} {
		t.Run(path, func(t *testing.T) {
			srv := valkeytest.Start(t, valkeytest.Options{})
			var clock atomic.Int64
			start := time.Now()
			clock.Store(start.UnixNano())
			lc := &losingClient{Client: realClient(t, srv.Addr)}
			s := storeOver(t, lc, Options{Addresses: []string{srv.Addr}, ReplayInterval: time.Hour, StallAfter: -1,
				Now: func() time.Time { return time.Unix(0, clock.Load()) }})
			var mu sync.Mutex
			reported := map[any]uint64{}
			s.ReportExpired(func(owner any, tokens uint64) {
				mu.Lock()
				reported[owner] += tokens
				mu.Unlock()
			})
			window := start.Add(time.Hour).Unix()
			exp := time.Unix(window, 0)
			owner := &struct{ name string }{"budget b"}
			hold := store.Hold{Expiry: 10 * time.Second, Window: window, Owner: owner}
			at := func(d time.Duration) { clock.Store(start.Add(d).UnixNano()) }
			check := func(who string, reserve uint64) {
				t.Helper()
				h := hold
				h.Reserve = reserve
				rs := make([]store.Result, 1)
				err := s.Charge(context.Background(), []store.Counter{{Key: "k", ExpireAt: exp, Start: true, Limit: 100, Enforce: true, Hold: h}}, rs)
				if err != nil || !rs[0].Held {
					t.Fatalf("check %s: %+v, %v; want held", who, rs[0], err)
				}
			}
			check("A", 5)
			at(6 * time.Second)
			check("B", 3)
			at(7 * time.Second)
			h := hold
			h.Release = 1
			charge := []store.Counter{{Key: "k", Hits: 2, ExpireAt: exp, Hold: h}}
			rs := make([]store.Result, 1)
			switch path {
			case "buffered":
				s.Defer(charge) // its deadline passed before it was sent
			case "kept unanswered":
				lc.lose.Store(true)
				_ = s.Charge(context.Background(), charge, rs) // kept under its id
				lc.lose.Store(false)
			}
			at(11 * time.Second)
			if path == "answered" {
				if err := s.Charge(context.Background(), charge, rs); err != nil || rs[0].Expired != 5 {
					t.Fatalf("charge: %+v, %v; want A's 5 tokens found expired", rs[0], err)
				}
			}
			for s.Stats().BufferKeys > 0 {
				if !s.replayOnce() {
					t.Fatalf("replay failed: %+v", s.Stats())
				}
			}
			mu.Lock()
			defer mu.Unlock()
			want := uint64(5)
			if path == "answered" {
				want = 0 // in the call's own result: counted by its caller
			}
			if reported[owner] != want || len(reported) > 1 {
				t.Errorf("reported %v; want %d tokens for the counter's owner (A's hold, found expired by the %s release)", reported, want, path)
			}
			if got, _ := srv.Do("HLEN", "bgh|"+strconv.FormatInt(window, 10)); got != "0" {
				t.Errorf("hold hash keeps %s fields; want none: B's hold released, A's expired", got)
			}
		})
	}
}
