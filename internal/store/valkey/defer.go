package valkey

import "github.com/budgetgen/budgetgen/internal/store"

// Defer implements store.Deferrer: hits that certainly never reached Valkey
// (their call's deadline passed before it started) go to the outage buffer,
// counted as Buffered (or Lost when the buffer is full or disabled), with
// their ledger increments.
func (s *Store) Defer(counters []store.Counter) { s.notSent(counters) }
