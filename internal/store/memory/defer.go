package memory

import (
	"context"

	"github.com/budgetgen/budgetgen/internal/store"
)

// Defer implements store.Deferrer: the memory store has no network to miss,
// so hits (and hold releases) whose call never started are applied now (a
// refusal at the counter bound is counted in Stats.Refused as any other).
// Holds are not placed: their requests have had their answer.
func (s *Store) Defer(counters []store.Counter) {
	cs := make([]store.Counter, len(counters))
	for i, c := range counters {
		c.Hold.Reserve = 0
		cs[i] = c
	}
	_ = s.Charge(context.Background(), cs, make([]store.Result, len(cs)))
}
