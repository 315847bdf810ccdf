package valkey

import (
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// TestDeferBuffersAndReplays: hits handed to Defer (their call never
// started) are buffered, counted, and replayed into Valkey exactly once,
// with their ledger increments.
func TestDeferBuffersAndReplays(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}, ReplayInterval: 10 * time.Millisecond})
	exp := time.Now().Add(time.Hour)
	var d store.Deferrer = s
	d.Defer([]store.Counter{
		{Key: "df", Hits: 4, ExpireAt: exp, Ledger: store.HashIncr{Key: "dl", Field: "p"}},
		{Key: "df", Hits: 3, ExpireAt: exp},
		{Key: "check", Hits: 0, ExpireAt: exp},
	})
	if st := s.Stats(); st.Buffered != 7 || st.LedgerBuffered != 4 {
		t.Fatalf("stats after Defer: %+v", st)
	}
	waitDrained(t, s, 3*time.Second)
	if v, _ := srv.Do("GET", "df"); v != "7" {
		t.Fatalf("df = %q, want 7", v)
	}
	if v, _ := srv.Do("HGET", "dl", "p"); v != "4" {
		t.Fatalf("ledger field = %q, want 4", v)
	}
	if v, _ := srv.Do("EXISTS", "check"); v != "0" {
		t.Fatalf("a check-only counter was created by Defer: EXISTS = %q", v)
	}
	if st := s.Stats(); st.Replayed != 7 || st.Lost != 0 {
		t.Fatalf("stats after replay: %+v", st)
	}
}
