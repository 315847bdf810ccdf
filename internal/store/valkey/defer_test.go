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

// TestDeferRacingCloseLosesNothing: a Close that starts while Defer is
// between its closed check and its buffering must not drain the buffer
// before those hits are in it; they are replayed by Close's last attempt
// (or counted Lost), never left Buffered and unaccounted. The hook holds
// Defer at that point for up to a second, long enough for an unguarded
// Close to finish.
func TestDeferRacingCloseLosesNothing(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}, ReplayInterval: time.Hour})
	entered, closeDone := make(chan struct{}), make(chan struct{})
	s.testHookDeferred = func() {
		close(entered)
		select {
		case <-closeDone:
		case <-time.After(time.Second):
		}
	}
	deferDone := make(chan struct{})
	go func() {
		defer close(deferDone)
		s.Defer([]store.Counter{{Key: "dc", Hits: 5, ExpireAt: time.Now().Add(time.Hour)}})
	}()
	<-entered
	go func() {
		defer close(closeDone)
		_ = s.Close()
	}()
	<-deferDone
	<-closeDone
	v, _ := srv.Do("GET", "dc")
	st := s.Stats()
	replayed, lost := v == "5" && st.Lost == 0, v == "(nil)" && st.Lost == 5
	if !replayed && !lost || st.BufferKeys != 0 {
		t.Fatalf("after Defer raced Close: GET dc = %q, stats %+v; want the 5 hits replayed or counted Lost, none left buffered", v, st)
	}
}
