package valkey

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/schedtest"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// TestStallGuard: once Valkey has answered nothing for StallAfter since a
// call was sent, charges are buffered at once instead of being sent into
// the stalled connection (where they would be ambiguous); a probe per
// StallAfter finds the server back, and every hit ends up counted once.
func TestStallGuard(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}, StallAfter: 50 * time.Millisecond, ReplayInterval: 20 * time.Millisecond})
	exp := time.Now().Add(time.Hour)
	charge := func(d time.Duration) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		t0 := time.Now()
		err := s.Charge(ctx, []store.Counter{{Key: "g", Hits: 1, ExpireAt: exp}}, make([]store.Result, 1))
		return time.Since(t0), err
	}
	if _, err := charge(time.Second); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	waitUnresponsive := time.Now().Add(2 * time.Second)
	for time.Now().Before(waitUnresponsive) {
		if _, err := charge(20 * time.Millisecond); err != nil {
			break // sent into the stall, timed out: the guard's clock runs
		}
	}
	time.Sleep(80 * time.Millisecond) // stays: StallAfter (50 ms) of silence trips the guard
	// "At once" is relative to this run: under 10 ms plus the scheduler's
	// worst lag meanwhile (the refusal's error says it came from the stall
	// guard, not from the 20 ms deadline).
	lag := schedtest.Start()
	var refusals []time.Duration
	for i := 0; i < 50; i++ {
		lat, err := charge(20 * time.Millisecond)
		if err == nil {
			lag.Stop()
			t.Fatal("charge succeeded against a stopped server")
		}
		if strings.Contains(err.Error(), "answered nothing") {
			refusals = append(refusals, lat)
		}
	}
	lagMax := worstLag(lag)
	fast := 0
	for _, lat := range refusals {
		if lat < 10*time.Millisecond+lagMax {
			fast++
		}
	}
	st := s.Stats()
	if fast < 40 || st.Stalled < 40 || st.Buffered < st.Stalled {
		t.Fatalf("%d of 50 calls refused at once (within 10 ms + scheduler lag %v); stats %+v", fast, lagMax, st)
	}
	srv.Cont()
	deadline := time.Now().Add(2 * time.Second)
	for {
		if _, err := charge(200 * time.Millisecond); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no charge succeeded within 2 s of SIGCONT")
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	waitDrained(t, s, 3*time.Second)
	st = s.Stats()
	got, _ := srv.Do("GET", "g")
	// Every hit was sent once: acknowledged, applied after its caller gave
	// up, buffered and replayed, or ambiguous (maybe applied).
	n, _ := strconv.ParseUint(got, 10, 64)
	if st.Lost != 0 || st.Replayed != st.Buffered || n < st.Replayed || st.Ambiguous > 5 {
		t.Fatalf("g = %d; stats %+v", n, st)
	}
}
