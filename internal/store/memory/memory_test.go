package memory

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/storetest"
)

func TestBehaviour(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return New(Options{SweepInterval: 50 * time.Millisecond}) })
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func charge(t *testing.T, s *Store, key string, hits uint64, exp time.Time) (uint64, error) {
	t.Helper()
	totals := make([]store.Result, 1)
	err := s.Charge(context.Background(), []store.Counter{{Key: key, Hits: hits, ExpireAt: exp}}, totals)
	return totals[0].Total, err
}

func TestInjectedClockExpiry(t *testing.T) {
	clk := &fakeClock{now: time.Date(2026, 11, 30, 23, 59, 59, 900e6, time.UTC)}
	s := New(Options{Now: clk.Now, SweepInterval: time.Hour})
	defer s.Close()
	midnight := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if got, _ := charge(t, s, "day1", 5, midnight); got != 5 {
		t.Fatalf("got %d", got)
	}
	clk.Add(99 * time.Millisecond) // 23:59:59.999
	if got, _ := charge(t, s, "day1", 0, midnight); got != 5 {
		t.Fatalf("just before expiry: %d, want 5", got)
	}
	clk.Add(time.Millisecond) // 00:00:00.000: expired
	if got, _ := charge(t, s, "day1", 0, midnight); got != 0 {
		t.Fatalf("at expiry: %d, want 0", got)
	}
	if s.Stats().Counters != 1 {
		t.Fatalf("expired counter should stay until swept: %+v", s.Stats())
	}
	s.Sweep()
	if st := s.Stats(); st.Counters != 0 || st.Swept != 1 {
		t.Fatalf("after sweep: %+v", st)
	}
}

func TestJanitorSweepsAndStops(t *testing.T) {
	before := runtime.NumGoroutine()
	clk := &fakeClock{now: time.Unix(1_000_000, 0)}
	s := New(Options{Now: clk.Now, SweepInterval: 10 * time.Millisecond})
	for i := 0; i < 100; i++ {
		if _, err := charge(t, s, fmt.Sprint("k", i), 1, clk.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Stats().Counters; got != 100 {
		t.Fatalf("counters = %d", got)
	}
	clk.Add(2 * time.Second)
	deadline := time.Now().Add(2 * time.Second)
	for s.Stats().Counters != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	if st := s.Stats(); st.Counters != 0 || st.Swept != 100 {
		t.Fatalf("janitor did not sweep: %+v", st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The janitor goroutine is gone once Close returns.
	deadline = time.Now().Add(time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("goroutines after Close = %d, before New = %d", n, before)
	}
}

func TestBoundRefusesNewKeysNeverDropsCounts(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1_000_000, 0)}
	s := New(Options{Now: clk.Now, MaxCounters: 10, Shards: 4, SweepInterval: time.Hour})
	defer s.Close()
	exp := clk.Now().Add(time.Minute)
	for i := 0; i < 10; i++ {
		if _, err := charge(t, s, fmt.Sprint("k", i), 1, exp); err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	_, err := charge(t, s, "new", 1, exp)
	if !errors.Is(err, ErrFull) || !errors.Is(err, store.ErrFull) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("11th key: err = %v, want ErrFull wrapping store.ErrFull, not ErrUnavailable (the default policy denies)", err)
	}
	// A multi-counter call needing one new key is refused as a whole.
	totals := make([]store.Result, 2)
	err = s.Charge(context.Background(), []store.Counter{{Key: "k0", Hits: 1, ExpireAt: exp}, {Key: "new2", Hits: 1, ExpireAt: exp}}, totals)
	if !errors.Is(err, ErrFull) {
		t.Fatalf("mixed call: %v", err)
	}
	if got, _ := charge(t, s, "k0", 0, exp); got != 1 {
		t.Fatalf("k0 after refused call = %d, want 1 (refusal must change nothing)", got)
	}
	// Existing keys keep counting at the bound; checks of new keys still answer.
	if got, err := charge(t, s, "k1", 4, exp); err != nil || got != 5 {
		t.Fatalf("existing key at bound = %d, %v", got, err)
	}
	if got, err := charge(t, s, "absent", 0, exp); err != nil || got != 0 {
		t.Fatalf("check at bound = %d, %v", got, err)
	}
	if st := s.Stats(); st.Refused != 2 || st.Counters != 10 {
		t.Fatalf("stats = %+v, want Refused 2, Counters 10", st)
	}
	// Once counters expire, room is reclaimed without waiting for the janitor
	// in the shards the call holds: a new key in k0's shard (shards are
	// seeded per store, so the key is found, not written down; "new" shares
	// no shard with any k in about 6% of stores).
	clk.Add(2 * time.Minute)
	fresh := "new"
	for i := 0; s.shardOf(fresh) != s.shardOf("k0"); i++ {
		fresh = fmt.Sprint("new", i)
	}
	if _, err := charge(t, s, fresh, 1, clk.Now().Add(time.Minute)); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if st := s.Stats(); st.Counters > 10 {
		t.Fatalf("counters %d above bound", st.Counters)
	}
}

func TestBoundUnderConcurrency(t *testing.T) {
	s := New(Options{MaxCounters: 500, Shards: 8})
	defer s.Close()
	exp := time.Now().Add(time.Hour)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, full := 0, 0
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				_, err := charge(t, s, fmt.Sprintf("w%d-%d", w, i), 1, exp)
				mu.Lock()
				if err == nil {
					ok++
				} else if errors.Is(err, ErrFull) {
					full++
				} else {
					t.Error(err)
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	st := s.Stats()
	if st.Counters != int64(ok) || ok > 500 || ok+full != 1600 || st.Refused != uint64(full) {
		t.Fatalf("ok=%d full=%d stats=%+v", ok, full, st)
	}
}

func TestNoKeyCreatedByCheck(t *testing.T) {
	s := New(Options{})
	defer s.Close()
	for i := 0; i < 10; i++ {
		if _, err := charge(t, s, fmt.Sprint("c", i), 0, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Stats().Counters; n != 0 {
		t.Fatalf("checks created %d counters", n)
	}
}

// TestLongCallDuplicatesAndOverflow: a call with many counters (the map path)
// applies duplicates in order and refuses an overflow as a whole.
func TestLongCallDuplicatesAndOverflow(t *testing.T) {
	s := New(Options{})
	defer s.Close()
	exp := time.Now().Add(time.Hour)
	var cs []store.Counter
	for i := 0; i < 40; i++ {
		cs = append(cs, store.Counter{Key: fmt.Sprint("k", i%4), Hits: 1, ExpireAt: exp})
	}
	totals := make([]store.Result, len(cs))
	if err := s.Charge(context.Background(), cs, totals); err != nil {
		t.Fatal(err)
	}
	for i, v := range totals {
		if v.Total != uint64(i/4+1) {
			t.Fatalf("totals[%d] = %d, want %d", i, v.Total, i/4+1)
		}
	}
	cs[39].Hits = 1 << 62
	cs[35].Hits = 1 << 62 // k3 twice: 10 + 2^63 - 2 > MaxInt64 overall
	cs[31].Hits = 1 << 62
	err := s.Charge(context.Background(), cs, totals)
	if !errors.Is(err, store.ErrMalformedReply) {
		t.Fatalf("overflowing long call: %v", err)
	}
	if got, _ := charge(t, s, "k0", 0, exp); got != 10 {
		t.Fatalf("k0 after a refused call = %d, want 10", got)
	}
}

// TestFullFailurePolicy: with FullFailurePolicy the refusal also wraps
// store.ErrUnavailable, so the engine's failure policy answers.
func TestFullFailurePolicy(t *testing.T) {
	s := New(Options{MaxCounters: 1, FullPolicy: FullFailurePolicy})
	defer s.Close()
	exp := time.Now().Add(time.Hour)
	if _, err := charge(t, s, "a", 1, exp); err != nil {
		t.Fatal(err)
	}
	_, err := charge(t, s, "b", 1, exp)
	if !errors.Is(err, ErrFull) || !errors.Is(err, store.ErrFull) || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrFull wrapping store.ErrFull and store.ErrUnavailable", err)
	}
	for _, tc := range []struct {
		in   string
		want FullPolicy
		ok   bool
	}{{"", FullDeny, true}, {"deny", FullDeny, true}, {"failure-policy", FullFailurePolicy, true}, {"allow", FullDeny, false}} {
		got, err := ParseFullPolicy(tc.in)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("ParseFullPolicy(%q) = %v, %v", tc.in, got, err)
		}
	}
}

// TestBoundEvictsEndedWindows: at the bound, counters of windows that have
// ended (expiry within Grace) make room for a new counter, counted in
// Evicted; live windows' counters are never evicted. In the call's own
// shard at once; in the other shards by the janitor's full pass, which the
// refusal triggers.
func TestBoundEvictsEndedWindows(t *testing.T) {
	const grace = 5 * time.Minute
	t.Run("own shard", func(t *testing.T) {
		clk := &fakeClock{now: time.Unix(1_000_000, 0)}
		s := New(Options{Now: clk.Now, MaxCounters: 4, Shards: 1, Grace: grace, SweepInterval: time.Hour})
		defer s.Close()
		ended := clk.Now().Add(2 * time.Minute) // window over, 2 min of grace left
		live := clk.Now().Add(grace + time.Hour)
		for i, exp := range []time.Time{ended, ended, live, live} {
			if _, err := charge(t, s, fmt.Sprint("k", i), 3, exp); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < 2; i++ {
			if _, err := charge(t, s, fmt.Sprint("new", i), 1, live); err != nil {
				t.Fatalf("new counter %d: %v", i, err)
			}
		}
		if _, err := charge(t, s, "new2", 1, live); !errors.Is(err, store.ErrFull) {
			t.Fatalf("third new counter with only live windows left: err = %v, want ErrFull", err)
		}
		for _, k := range []string{"k2", "k3"} {
			if got, _ := charge(t, s, k, 0, live); got != 3 {
				t.Fatalf("live counter %s = %d, want 3 (never evicted)", k, got)
			}
		}
		if st := s.Stats(); st.Evicted != 2 || st.Counters != 4 || st.Refused != 1 {
			t.Fatalf("stats %+v: want Evicted 2, Counters 4, Refused 1", st)
		}
	})
	t.Run("other shards", func(t *testing.T) {
		clk := &fakeClock{now: time.Unix(1_000_000, 0)}
		s := New(Options{Now: clk.Now, MaxCounters: 64, Shards: 64, Grace: grace, SweepInterval: time.Hour})
		defer s.Close()
		ended := clk.Now().Add(time.Minute)
		for i := 0; i < 64; i++ {
			if _, err := charge(t, s, fmt.Sprint("k", i), 1, ended); err != nil {
				t.Fatal(err)
			}
		}
		live := clk.Now().Add(time.Hour)
		admitted := 0
		deadline := time.Now().Add(5 * time.Second)
		for i := 0; admitted < 32 && time.Now().Before(deadline); i++ {
			if _, err := charge(t, s, fmt.Sprint("new", i), 1, live); err == nil {
				admitted++
			} else if !errors.Is(err, store.ErrFull) {
				t.Fatal(err)
			} else {
				time.Sleep(10 * time.Millisecond) // poll interval: retried once the janitor has made room
			}
		}
		if st := s.Stats(); admitted != 32 || st.Evicted != 64 {
			t.Fatalf("admitted %d new counters, stats %+v: want 32 admitted and all 64 ended counters evicted", admitted, st)
		}
	})
}
