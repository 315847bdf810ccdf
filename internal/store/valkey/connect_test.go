package valkey

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/schedtest"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// TestConnectInBackground: Valkey down at start. New returns at once; every
// charge fails fast with ErrUnavailable and is buffered; once Valkey starts,
// the store connects by itself and the buffered hits land exactly once.
func TestConnectInBackground(t *testing.T) {
	port := valkeytest.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	logger, logs := testLogger(t)
	lag := schedtest.Start()
	start := time.Now()
	s, err := New(Options{Addresses: []string{addr}, ConnectInBackground: true, Logger: logger})
	if err != nil {
		t.Fatalf("New with Valkey down: %v", err)
	}
	defer s.Close()
	// 2 s plus the scheduler's worst lag: New must not wait for a dial.
	if d, lagMax := time.Since(start), worstLag(lag); d > 2*time.Second+lagMax {
		t.Fatalf("New took %v (bound 2 s + scheduler lag %v)", d, lagMax)
	}
	select {
	case <-s.Connected():
		t.Fatal("connected to nothing")
	default:
	}
	exp := time.Now().Add(time.Hour)
	const calls = 50
	for i := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		err := s.Charge(ctx, []store.Counter{{Key: "bg", Hits: uint64(i + 1), ExpireAt: exp}}, make([]store.Result, 1))
		cancel()
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("charge %d before connecting: %v, want ErrUnavailable", i, err)
		}
	}
	const want = calls * (calls + 1) / 2
	if st := s.Stats(); st.NotConnected != calls || st.Buffered != want || st.BufferKeys != 1 {
		t.Fatalf("stats before connecting %+v: want %d not connected, %d hits buffered in 1 key", st, calls, want)
	}
	// Valkey starts only after a background attempt has failed (logged), so
	// the store connects on a retry.
	waitUntil(t, 10*time.Second, func() bool { return strings.Contains(logs.String(), "still unreachable") })
	srv := valkeytest.Start(t, valkeytest.Options{Port: port})
	up := time.Now()
	select {
	case <-s.Connected():
	case <-time.After(10 * time.Second):
		t.Fatalf("not connected 10 s after Valkey started\n%s", logs)
	}
	t.Logf("connected %v after Valkey started", time.Since(up))
	waitDrained(t, s, 5*time.Second)
	if got, _ := srv.Do("GET", "bg"); got != fmt.Sprint(want) {
		t.Fatalf("GET bg = %s, want %d", got, want)
	}
	time.Sleep(300 * time.Millisecond) // stays: time passing must replay nothing more
	if got, _ := srv.Do("GET", "bg"); got != fmt.Sprint(want) {
		t.Fatalf("GET bg = %s later, want %d (replayed once)", got, want)
	}
	totals := make([]store.Result, 1)
	if err := s.Charge(context.Background(), []store.Counter{{Key: "bg", Hits: 1, ExpireAt: exp}}, totals); err != nil || totals[0].Total != want+1 {
		t.Fatalf("charge after connecting: %v, total %d", err, totals[0].Total)
	}
	if st := s.Stats(); st.Replayed != want || st.Lost != 0 {
		t.Fatalf("stats %+v", st)
	}
	if !strings.Contains(logs.String(), "valkey unreachable at start") || !strings.Contains(logs.String(), "valkey store: connected") {
		t.Fatalf("start-up outage and connection not logged:\n%s", logs)
	}
}

// TestConnectInBackgroundClosed: closed before ever connecting, the store
// counts its buffered hits as lost and stops retrying.
func TestConnectInBackgroundClosed(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", valkeytest.FreePort(t))
	s, err := New(Options{Addresses: []string{addr}, ConnectInBackground: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Charge(context.Background(), []store.Counter{{Key: "x", Hits: 4, ExpireAt: time.Now().Add(time.Hour)}}, make([]store.Result, 1))
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung")
	}
	if st := s.Stats(); st.Lost != 4 || st.BufferKeys != 0 {
		t.Fatalf("stats %+v: want the 4 buffered hits lost", st)
	}
}

// worstLag stops p and returns the worst scheduling lag it saw.
func worstLag(p *schedtest.Probe) time.Duration {
	_, worst := p.Stop()
	return worst
}
