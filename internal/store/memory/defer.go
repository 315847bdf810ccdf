package memory

import (
	"context"

	"github.com/budgetgen/budgetgen/internal/store"
)

// Defer implements store.Deferrer: the memory store has no network to miss,
// so hits whose call never started are applied now (a refusal at the
// counter bound is counted in Stats.Refused as any other).
func (s *Store) Defer(counters []store.Counter) {
	_ = s.Charge(context.Background(), counters, make([]uint64, len(counters)))
}
