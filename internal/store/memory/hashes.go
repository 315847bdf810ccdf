package memory

import (
	"context"

	"github.com/budgetgen/budgetgen/internal/store"
)

// WriteHashes implements store.HashWriter by handing the writes to the
// store's ledger (internal/ledger.Memory, which the debug server serves);
// without one they are ignored, as Counter.Ledger is.
func (s *Store) WriteHashes(ctx context.Context, w store.HashWrites) error {
	if hw, ok := s.ledger.(store.HashWriter); ok {
		return hw.WriteHashes(ctx, w)
	}
	return nil
}
