package valkey

import "github.com/budgetgen/budgetgen/internal/store"

// Defer implements store.Deferrer: hits that certainly never reached Valkey
// (their call's deadline passed before it started) go to the outage buffer,
// counted as Buffered (or Lost when the buffer is full or disabled), with
// their ledger increments. After Close nothing replays the buffer any more,
// so they are counted as Lost at once.
func (s *Store) Defer(counters []store.Counter) {
	s.entry.RLock() // Close waits, so these hits are buffered before it drains
	defer s.entry.RUnlock()
	if s.closed.Load() {
		for i := range counters {
			s.countWrite(&counters[i], store.Lost)
		}
		s.logs.loss(s.log, "store closed", s.Stats())
		return
	}
	if s.testHookDeferred != nil {
		s.testHookDeferred()
	}
	s.notSent(counters)
}
