package valkey

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// ledgerFixture builds ledger writes the way the engine does (Recorder.Usage)
// and a Recorder flushing through the store's own client, as the service wires it.
func ledgerFixture(t *testing.T, s *Store) (*ledger.Recorder, func(rule, principal string) store.HashIncr) {
	t.Helper()
	rec, err := ledger.NewRecorder(ledger.Options{Prefix: "t:"}, ledger.NewValkeySink(s.Client()), nil)
	if err != nil {
		t.Fatal(err)
	}
	return rec, func(rule, principal string) store.HashIncr {
		u := rec.Usage(ledger.RuleID{Domain: "ns/p", Rule: rule}, ledger.EncodePrincipal1(principal), time.Now(), 0)
		return store.HashIncr{Key: u.Key, Field: u.Field}
	}
}

// TestOutageBufferLedger: the ledger increments of charges made while Valkey
// is down are buffered with the counters (summed per hash and field), land
// exactly once after the restart, and a hash the replay created gets its
// expiry from the Recorder's flush, as on the normal path.
func TestOutageBufferLedger(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{Args: []string{"--appendonly", "yes", "--appendfsync", "always"}})
	logger, logs := testLogger(t)
	s := mustNew(t, Options{Addresses: []string{srv.Addr}, Logger: logger})
	rec, usage := ledgerFixture(t, s)
	exp := time.Now().Add(time.Hour)
	wantC := map[string]uint64{}
	wantL := map[store.HashIncr]uint64{}
	charge := func(i int, rule string) error {
		p := "p" + strconv.Itoa(i%3)
		h := uint64(i%4 + 1)
		cs := []store.Counter{
			{Key: "lc:" + rule + ":" + p, Hits: h, ExpireAt: exp, Ledger: usage(rule, p)},
			{Key: "lshared", Hits: 1, ExpireAt: exp, Ledger: usage(rule, "all")},
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		err := s.Charge(ctx, cs, make([]store.Result, len(cs)))
		for _, c := range cs {
			wantC[c.Key] += c.Hits
			wantL[c.Ledger] += c.Hits
		}
		return err
	}
	for i := 0; i < 10; i++ {
		if err := charge(i, "r0"); err != nil {
			t.Fatal(err)
		}
	}
	srv.Kill()
	// Let the connections' readers see the EOF: a charge written into the
	// dying socket before that is ambiguous (never re-sent), which is
	// TestFaultKill's subject, not this test's. Stays a sleep: valkey-go
	// shows no sign of having seen it, and a longer wait only makes it surer.
	time.Sleep(200 * time.Millisecond)
	var downL uint64
	before := map[store.HashIncr]uint64{}
	for k, v := range wantL {
		before[k] = v
	}
	for i := 0; i < 120; i++ {
		rule := "r0"
		if i%2 == 1 {
			rule = "r1" // a hash only the replay creates
		}
		if err := charge(i, rule); err == nil {
			t.Fatal("charge succeeded with Valkey down")
		}
		downL += uint64(i%4+1) + 1
	}
	st := s.Stats()
	// Counters: 3 principals x 2 rules + lshared; ledger fields: 4 per rule.
	if st.BufferKeys != 7+8 || st.LedgerBuffered != downL || st.LedgerLost != 0 || st.LedgerAmbiguous != 0 || st.Lost != 0 {
		t.Fatalf("while down: %+v; want 15 entries and %d ledger hits buffered, nothing lost or ambiguous", st, downL)
	}
	srv.Restart()
	waitDrained(t, s, 2*time.Second)
	check := func(when string) {
		t.Helper()
		for k, v := range wantC {
			if got, err := srv.Do("GET", k); err != nil || got != strconv.FormatUint(v, 10) {
				t.Errorf("%s: %s = %s, want %d (%v)", when, k, got, v, err)
			}
		}
		for h, v := range wantL {
			if got, err := srv.Do("HGET", h.Key, h.Field); err != nil || got != strconv.FormatUint(v, 10) {
				t.Errorf("%s: HGET %s %s = %s, want %d (%v)", when, h.Key, h.Field, got, v, err)
			}
		}
	}
	check("after replay")
	st = s.Stats()
	if st.LedgerReplayed != downL || st.Replayed != st.Buffered || st.LedgerLost != 0 || st.LedgerExpired != 0 {
		t.Fatalf("after replay: %+v; want %d ledger hits replayed", st, downL)
	}
	if !strings.Contains(logs.String(), "ledger_hits=") {
		t.Fatalf("ledger replay not logged:\n%s", logs)
	}
	// The hash created by the replay has no expiry until the Recorder's
	// flush, which sets the day's end plus the retention.
	r1 := usage("r1", "p0").Key
	if err := rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantExp := ledger.DayOf(time.Now()).ExpireAt(ledger.DefaultRetentionDays).Unix()
	for _, k := range []string{r1, usage("r0", "p0").Key} {
		if got, _ := srv.Do("EXPIRETIME", k); got != strconv.FormatInt(wantExp, 10) {
			// At 00:00 UTC the day may have turned between charge and check.
			if ledger.DayOf(time.Now()) == ledger.DayOf(exp.Add(-time.Hour)) {
				t.Errorf("EXPIRETIME %s = %s, want %d", k, got, wantExp)
			}
		}
	}
	// Replayed once: more time passing changes nothing.
	time.Sleep(300 * time.Millisecond)
	check("300 ms later")
	if st := s.Stats(); st.LedgerReplayed != downL {
		t.Fatalf("ledger replayed %d, want %d", st.LedgerReplayed, downL)
	}
}

// TestOutageBufferLedgerBound: ledger fields share the buffer's bound with
// counter keys; beyond it their increments are counted lost and logged.
func TestOutageBufferLedgerBound(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	logger, logs := testLogger(t)
	s := mustNew(t, Options{Addresses: []string{srv.Addr}, Logger: logger, BufferMaxKeys: 5})
	_, usage := ledgerFixture(t, s)
	exp := time.Now().Add(time.Hour)
	srv.Kill()
	// A charge written into the dying socket is ambiguous, not buffered.
	waitConnectionsDown(t, s)
	var lostWant uint64
	for i := 0; i < 6; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		c := store.Counter{Key: "b" + strconv.Itoa(i), Hits: uint64(i + 1), ExpireAt: exp, Ledger: usage("r", "p"+strconv.Itoa(i))}
		err := s.Charge(ctx, []store.Counter{c}, make([]store.Result, 1))
		cancel()
		if err == nil {
			t.Fatal("charge succeeded with Valkey down")
		}
		// Two entries per charge: b0,l0,b1,l1,b2 fit; l2 and everything after do not.
		if i >= 2 {
			lostWant += uint64(i + 1)
		}
	}
	st := s.Stats()
	if st.BufferKeys != 5 || st.LedgerBuffered != 1+2 || st.LedgerLost != lostWant || st.Lost != lostWant-3 {
		t.Fatalf("stats = %+v; want 5 entries, 3 ledger hits buffered, %d ledger and %d counter hits lost", st, lostWant, lostWant-3)
	}
	if !strings.Contains(logs.String(), "ledger increments lost") || !strings.Contains(logs.String(), "outage buffer full") {
		t.Fatalf("ledger loss not logged:\n%s", logs)
	}
	srv.Restart()
	waitDrained(t, s, 2*time.Second)
	for i := 0; i < 6; i++ {
		h := usage("r", "p"+strconv.Itoa(i))
		got, _ := srv.Do("HGET", h.Key, h.Field)
		want := strconv.Itoa(i + 1)
		if i >= 2 {
			want = "(nil)"
		}
		if got != want {
			t.Errorf("ledger p%d = %s, want %s", i, got, want)
		}
	}
	if got, _ := srv.Do("GET", "b2"); got != "3" {
		t.Errorf("b2 = %s, want 3", got)
	}
	if st := s.Stats(); st.LedgerReplayed != 3 {
		t.Fatalf("ledger replayed %d, want 3", st.LedgerReplayed)
	}
}

// TestLedgerWrongTypeNotBuffered: a ledger key holding another type fails
// only the measurement (counted lost, logged), never the charge.
func TestLedgerWrongTypeNotBuffered(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	logger, logs := testLogger(t)
	s := mustNew(t, Options{Addresses: []string{srv.Addr}, Logger: logger})
	if _, err := srv.Do("SET", "notahash", "x"); err != nil {
		t.Fatal(err)
	}
	totals := make([]store.Result, 1)
	err := s.Charge(context.Background(), []store.Counter{{Key: "c", Hits: 7, ExpireAt: time.Now().Add(time.Hour), Ledger: store.HashIncr{Key: "notahash", Field: "f"}}}, totals)
	if err != nil || totals[0].Total != 7 {
		t.Fatalf("charge = %v, %v; want nil, 7", err, totals)
	}
	if st := s.Stats(); st.LedgerLost != 7 || st.BufferKeys != 0 || st.Lost != 0 {
		t.Fatalf("stats = %+v; want 7 ledger hits lost, nothing buffered", st)
	}
	if !strings.Contains(logs.String(), "ledger increments lost") {
		t.Fatalf("loss not logged:\n%s", logs)
	}
}
