package valkey

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// TestLedgerFlushThroughStore: the ledger Recorder's flush, written through
// the store (store.HashWriter), lands in Valkey with its expiry, and while
// Valkey stalls it is refused at once by the stall guard instead of being
// sent into the stalled connection, as a write not sent (store.ErrNotSent).
func TestLedgerFlushThroughStore(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}, StallAfter: 50 * time.Millisecond})
	now := time.Now()
	rec, err := ledger.NewRecorder(ledger.Options{Prefix: "t:"}, ledger.NewStoreSink(s), func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	r := ledger.RuleID{Domain: "d", Rule: "r"}
	rec.Denied(r, now, false)
	rec.Denied(r, now, false)
	rec.Denied(r, now, true)
	if err := rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	k := ledger.StatsKey("t:", r, ledger.DayOf(now))
	got, err := srv.Do("HGETALL", k)
	if err != nil || !strings.Contains(got, "2") {
		t.Fatalf("HGETALL %s = %q, %v; want the denial counts", k, got, err)
	}
	if ttl, err := srv.Do("TTL", k); err != nil || strings.HasPrefix(ttl, "-") {
		t.Fatalf("TTL %s = %q, %v; want an expiry", k, ttl, err)
	}

	// Stall: a charge is sent and never answered; past StallAfter the
	// ledger write is not sent.
	srv.Stop()
	defer srv.Cont()
	exp := now.Add(time.Hour)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := s.Charge(ctx, []store.Counter{{Key: "g", Hits: 1, ExpireAt: exp}}, make([]store.Result, 1))
		cancel()
		if err != nil {
			break
		}
	}
	var last error
	refused := false
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && !refused; {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		last = s.WriteHashes(ctx, store.HashWrites{Incr: []store.HashIncrBy{{HashIncr: store.HashIncr{Key: k, Field: "x"}, N: 1}}})
		cancel()
		refused = last != nil && strings.Contains(last.Error(), "answered nothing")
	}
	if !refused || !errors.Is(last, store.ErrUnavailable) {
		t.Fatalf("ledger write during a stall: %v, want refused by the stall guard", last)
	}
	// Refused unsent: the Recorder may keep the batch and send it later
	// without counting it twice.
	if !errors.Is(last, store.ErrNotSent) {
		t.Fatalf("ledger write refused by the stall guard: %v, want store.ErrNotSent", last)
	}
}
