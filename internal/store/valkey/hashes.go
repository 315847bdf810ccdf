package valkey

import (
	"context"
	"fmt"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// WriteHashes implements store.HashWriter: the ledger's flush in one DoMulti
// (HINCRBY per field, then EXPIREAT per hash), under the same in-flight
// bound and stall guard as charges: it is not sent into a stall, and it waits
// for a slot no longer than ctx allows. An error that wraps store.ErrNotSent
// sent nothing; any other may have been applied (a send that timed out or
// lost its connection), so the caller must not send the writes again.
func (s *Store) WriteHashes(ctx context.Context, w store.HashWrites) error {
	if s.closed.Load() {
		return fmt.Errorf("%w: %w", store.ErrNotSent, errClosed)
	}
	if len(w.Incr)+len(w.Expire) == 0 {
		return nil
	}
	if !s.ready.Load() {
		// Connecting in the background (ConnectInBackground): the Recorder
		// keeps the batch and sends it at its next flush.
		return fmt.Errorf("%w: %w: not connected to valkey yet: ledger write not sent", store.ErrUnavailable, store.ErrNotSent)
	}
	if since, stalled := s.stall.stalled(); stalled {
		return fmt.Errorf("%w: %w: valkey has answered nothing for %v: ledger write not sent", store.ErrUnavailable, store.ErrNotSent, since.Round(time.Millisecond))
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("%w: %w: no free slot for the ledger write: %w", store.ErrUnavailable, store.ErrNotSent, ctx.Err())
	}
	defer func() { <-s.sem }()
	cmds := make(valkey.Commands, 0, len(w.Incr)+len(w.Expire))
	for _, h := range w.Incr {
		if h.N > 1<<63-1 {
			return fmt.Errorf("ledger write: increment %d of %s above the counter range", h.N, h.Key)
		}
		cmds = append(cmds, s.b.Hincrby().Key(h.Key).Field(h.Field).Increment(int64(h.N)).Build())
	}
	for _, e := range w.Expire {
		cmds = append(cmds, s.b.Expireat().Key(e.Key).Timestamp(e.At.Unix()).Build())
	}
	res := s.do(ctx, cmds)
	for i, r := range res {
		if err := r.Error(); err != nil {
			return fmt.Errorf("ledger write (%d of %d commands): %w", i+1, len(cmds), wrapErr(err))
		}
	}
	return nil
}
