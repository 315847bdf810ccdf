package memory

import (
	"context"

	"github.com/budgetgen/budgetgen/internal/store"
)

// Defer implements store.Deferrer: the memory store has no network to miss,
// so hits (and hold releases) whose call never started are applied now (a
// refusal at the counter bound is counted in Stats.Refused as any other).
// Holds are not placed: their requests have had their answer. Holds its
// releases find expired go to the ReportExpired func: the caller does not
// read these results.
func (s *Store) Defer(counters []store.Counter) {
	cs := make([]store.Counter, len(counters))
	for i, c := range counters {
		c.Hold.Reserve = 0
		cs[i] = c
	}
	rs := make([]store.Result, len(cs))
	if s.Charge(context.Background(), cs, rs) != nil {
		return
	}
	if f := s.onExpired.Load(); f != nil {
		for i := range rs {
			if rs[i].Expired > 0 {
				(*f)(cs[i].Hold.Owner, rs[i].Expired)
			}
		}
	}
}

// ReportExpired implements store.ExpiryReporter (see Defer).
func (s *Store) ReportExpired(f func(owner any, tokens uint64)) {
	if f == nil {
		s.onExpired.Store(nil)
		return
	}
	s.onExpired.Store(&f)
}
