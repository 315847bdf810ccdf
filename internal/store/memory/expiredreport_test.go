package memory

import (
	"context"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
)

// TestDeferReportsExpiredHolds: hits and releases handed to Defer (their
// call's deadline passed before it started) are applied at once, and a
// release can find the counter's older holds expired; Defer's caller reads
// no result, so those tokens were discarded and missing from
// ratelimit_reservation_expired_tokens_total. They go to the ReportExpired
// func with the counter's Hold.Owner. Holds live 10 s: A holds 5 at 0 s, B
// holds 3 at 6 s, B's deferred charge at 11 s finds A's 5 tokens expired.
func TestDeferReportsExpiredHolds(t *testing.T) {
	clk := &fakeClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	s := New(Options{Now: clk.Now, SweepInterval: time.Hour})
	defer s.Close()
	var owners []any
	var tokens uint64
	s.ReportExpired(func(owner any, n uint64) { owners, tokens = append(owners, owner), tokens+n })
	owner := &struct{ name string }{"budget b"}
	exp := clk.Now().Add(time.Hour)
	hold := store.Hold{Expiry: 10 * time.Second, Owner: owner}
	for _, reserve := range []uint64{5, 3} {
		h := hold
		h.Reserve = reserve
		rs := make([]store.Result, 1)
		if err := s.Charge(context.Background(), []store.Counter{{Key: "k", ExpireAt: exp, Start: true, Limit: 100, Enforce: true, Hold: h}}, rs); err != nil || !rs[0].Held {
			t.Fatalf("check holding %d: %+v, %v", reserve, rs[0], err)
		}
		clk.Add(6 * time.Second)
	}
	clk.Add(-time.Second) // 11 s
	h := hold
	h.Release = 1
	s.Defer([]store.Counter{{Key: "k", Hits: 2, ExpireAt: exp, Hold: h}})
	if tokens != 5 || len(owners) != 1 || owners[0] != owner {
		t.Fatalf("reported %d tokens for %v; want A's 5 for the counter's owner", tokens, owners)
	}
}
