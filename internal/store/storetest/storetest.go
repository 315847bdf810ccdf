// Package storetest is the behaviour suite every store.Store implementation
// must pass. It asserts what the decision engine relies on (totals, check-only
// reads, absolute expiry, independence of keys, exact totals under concurrency,
// deadlines, Close), never the commands an implementation sends.
//
// Expiry is observed in real time (about 1.5 s per expiry test), because a
// Valkey server expires keys on its own clock.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
)

// NewStore returns a fresh store for one sub-test. The suite closes it.
type NewStore func(t *testing.T) store.Store

// Run runs every behaviour test against stores made by newStore. Sub-tests use
// keys derived from their own names, so a shared server is fine.
func Run(t *testing.T, newStore NewStore) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store, k keyer)
	}{
		{"TotalsAfterCharges", testTotals},
		{"CheckOnlyReadsWithoutCreating", testCheckOnly},
		{"AbsoluteExpirySetOnce", testAbsoluteExpiry},
		{"ExpiryInThePast", testPastExpiry},
		{"WindowKeysIndependent", testIndependentKeys},
		{"ManyCountersOneCall", testManyCounters},
		{"ConcurrentExactTotal", testConcurrent},
		{"ContextDeadline", testContextDeadline},
		{"BadInput", testBadInput},
		{"Overflow", testOverflow},
		{"Close", testClose},
		{"HoldsAdmitAndRelease", testHoldsAdmitAndRelease},
		{"HoldsAllOrNone", testHoldsAllOrNone},
		{"HoldsExpire", testHoldsExpire},
		{"HoldsConcurrent", testHoldsConcurrent},
		{"HoldsByWindow", testHoldsByWindow},
		{"CheckAfterChargeInOneCall", testCheckAfterChargeInOneCall},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			closed := false
			t.Cleanup(func() {
				if !closed {
					_ = s.Close()
				}
			})
			if tc.name == "Close" {
				closed = true
			}
			tc.fn(t, s, keyer(fmt.Sprintf("storetest:%s:%d:", tc.name, time.Now().UnixNano())))
		})
	}
}

type keyer string

func (k keyer) key(name string) string { return string(k) + name }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return c
}

// charge charges one counter and returns its total, failing the test on error.
func charge(t *testing.T, s store.Store, key string, hits uint64, exp time.Time) uint64 {
	t.Helper()
	totals := []store.Result{{Total: math.MaxUint64}}
	if err := s.Charge(ctx(t), []store.Counter{{Key: key, Hits: hits, ExpireAt: exp}}, totals); err != nil {
		t.Fatalf("Charge(%s, %d): %v", key, hits, err)
	}
	return totals[0].Total
}

func hour() time.Time { return time.Now().Add(time.Hour) }

func testTotals(t *testing.T, s store.Store, k keyer) {
	key := k.key("a")
	want := uint64(0)
	for _, h := range []uint64{3, 4, 1, 1000, 1} {
		want += h
		if got := charge(t, s, key, h, hour()); got != want {
			t.Fatalf("total after +%d = %d, want %d", h, got, want)
		}
	}
}

func testCheckOnly(t *testing.T, s store.Store, k keyer) {
	key := k.key("c")
	if got := charge(t, s, key, 0, time.Now().Add(time.Second)); got != 0 {
		t.Fatalf("check of a missing key = %d, want 0", got)
	}
	// Had the check created the key, it would carry the check's 1 s expiry and
	// the NX expiry of this charge would not replace it: the counter would be
	// gone after 1 s.
	if got := charge(t, s, key, 2, hour()); got != 2 {
		t.Fatalf("charge after check = %d, want 2", got)
	}
	for i := 0; i < 3; i++ {
		if got := charge(t, s, key, 0, hour()); got != 2 {
			t.Fatalf("check %d after charge = %d, want 2 (a check must not add)", i, got)
		}
	}
	time.Sleep(1500 * time.Millisecond)
	if got := charge(t, s, key, 0, hour()); got != 2 {
		t.Fatalf("check after the check's expiry passed = %d, want 2: the check created the key", got)
	}
	// A check of a key that never existed stays absent: a later charge starts at 0.
	key2 := k.key("c2")
	for i := 0; i < 3; i++ {
		if got := charge(t, s, key2, 0, hour()); got != 0 {
			t.Fatalf("repeated check of a missing key = %d, want 0", got)
		}
	}
	if got := charge(t, s, key2, 1, hour()); got != 1 {
		t.Fatalf("first charge after checks = %d, want 1", got)
	}
}

func testAbsoluteExpiry(t *testing.T, s store.Store, k keyer) {
	key := k.key("e")
	first := time.Now().Add(1 * time.Second)
	if got := charge(t, s, key, 1, first); got != 1 {
		t.Fatalf("first charge = %d", got)
	}
	// Later charges carry a later expiry; the first one must stay.
	for i := 2; i <= 4; i++ {
		if got := charge(t, s, key, 1, hour()); got != uint64(i) {
			t.Fatalf("charge %d = %d", i, got)
		}
	}
	time.Sleep(time.Until(first) + 400*time.Millisecond)
	if got := charge(t, s, key, 0, hour()); got != 0 {
		t.Fatalf("check after the first expiry = %d, want 0: a later charge moved the expiry", got)
	}
	if got := charge(t, s, key, 5, hour()); got != 5 {
		t.Fatalf("charge after expiry = %d, want 5 (a new counter)", got)
	}
}

func testPastExpiry(t *testing.T, s store.Store, k keyer) {
	key := k.key("p")
	if got := charge(t, s, key, 3, time.Now().Add(-time.Minute)); got != 3 {
		t.Fatalf("charge with a past expiry = %d, want 3", got)
	}
	if got := charge(t, s, key, 0, hour()); got != 0 {
		t.Fatalf("check after a charge with a past expiry = %d, want 0", got)
	}
}

func testIndependentKeys(t *testing.T, s store.Store, k keyer) {
	w1, w2, other := k.key("user1:day:1000"), k.key("user1:day:2000"), k.key("user2:day:1000")
	charge(t, s, w1, 7, hour())
	if got := charge(t, s, w2, 1, hour()); got != 1 {
		t.Fatalf("next window = %d, want 1", got)
	}
	if got := charge(t, s, other, 2, hour()); got != 2 {
		t.Fatalf("other principal = %d, want 2", got)
	}
	if got := charge(t, s, w1, 0, hour()); got != 7 {
		t.Fatalf("first window = %d, want 7", got)
	}
}

func testManyCounters(t *testing.T, s store.Store, k keyer) {
	exp := hour()
	charge(t, s, k.key("m1"), 10, exp)
	cs := []store.Counter{
		{Key: k.key("m0"), Hits: 1, ExpireAt: exp},
		{Key: k.key("m1"), Hits: 0, ExpireAt: exp},
		{Key: k.key("m2"), Hits: 5, ExpireAt: exp},
		{Key: k.key("m0"), Hits: 2, ExpireAt: exp}, // same key twice: applied in order
		{Key: k.key("missing"), Hits: 0, ExpireAt: exp},
		{Key: k.key("m1"), Hits: 3, ExpireAt: exp},
	}
	for i := 0; i < 10; i++ {
		cs = append(cs, store.Counter{Key: k.key(fmt.Sprintf("n%d", i)), Hits: uint64(i + 1), ExpireAt: exp})
	}
	totals := make([]store.Result, len(cs))
	if err := s.Charge(ctx(t), cs, totals); err != nil {
		t.Fatal(err)
	}
	want := []uint64{1, 10, 5, 3, 0, 13}
	for i := 0; i < 10; i++ {
		want = append(want, uint64(i+1))
	}
	for i := range want {
		if totals[i].Total != want[i] {
			t.Fatalf("totals = %v, want %v", totals, want)
		}
	}
	if got := charge(t, s, k.key("m0"), 0, exp); got != 3 {
		t.Fatalf("m0 after = %d, want 3", got)
	}
}

func testConcurrent(t *testing.T, s store.Store, k keyer) {
	const workers, perWorker = 16, 100
	key, other := k.key("hot"), k.key("hot2")
	exp := hour()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var seen []uint64
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			local := make([]uint64, 0, perWorker)
			totals := make([]store.Result, 2)
			for i := 0; i < perWorker; i++ {
				hits := uint64(i%3 + 1)
				c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := s.Charge(c, []store.Counter{{Key: key, Hits: hits, ExpireAt: exp}, {Key: other, Hits: 1, ExpireAt: exp}}, totals)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				// Each add returns the counter right after it, so totals
				// seen by different adds of hits>=1 are all distinct.
				local = append(local, totals[0].Total)
			}
			mu.Lock()
			seen = append(seen, local...)
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent charge: %v", err)
	}
	var want uint64
	for i := 0; i < perWorker; i++ {
		want += uint64(i%3 + 1)
	}
	want *= workers
	if got := charge(t, s, key, 0, exp); got != want {
		t.Fatalf("total after %d concurrent charges = %d, want %d", workers*perWorker, got, want)
	}
	if got := charge(t, s, other, 0, exp); got != workers*perWorker {
		t.Fatalf("second counter = %d, want %d", got, workers*perWorker)
	}
	sort.Slice(seen, func(i, j int) bool { return seen[i] < seen[j] })
	for i := 1; i < len(seen); i++ {
		if seen[i] == seen[i-1] {
			t.Fatalf("two adds returned the same total %d: adds were not atomic", seen[i])
		}
	}
	if seen[len(seen)-1] != want {
		t.Fatalf("largest returned total = %d, want %d", seen[len(seen)-1], want)
	}
}

func testContextDeadline(t *testing.T, s store.Store, k keyer) {
	key := k.key("d")
	c, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-c.Done()
	start := time.Now()
	err := s.Charge(c, []store.Counter{{Key: key, Hits: 1, ExpireAt: hour()}}, make([]store.Result, 1))
	if took := time.Since(start); took > 250*time.Millisecond {
		t.Fatalf("Charge with an expired context took %v", took)
	}
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, store.ErrNotSent) {
		t.Fatalf("Charge with an expired context: err = %v, want ErrUnavailable, ErrNotSent and DeadlineExceeded", err)
	}
	if got := charge(t, s, key, 0, hour()); got != 0 {
		t.Fatalf("a call whose context had expired charged %d", got)
	}
	// A live deadline is met.
	c2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	if err := s.Charge(c2, []store.Counter{{Key: key, Hits: 1, ExpireAt: hour()}}, make([]store.Result, 1)); err != nil {
		t.Fatalf("Charge with a 1 s deadline: %v", err)
	}
	if dl, _ := c2.Deadline(); time.Now().After(dl) {
		t.Fatal("Charge returned after its deadline")
	}
}

func testBadInput(t *testing.T, s store.Store, k keyer) {
	key := k.key("b")
	if err := s.Charge(ctx(t), nil, nil); err != nil {
		t.Fatalf("empty call: %v", err)
	}
	if err := s.Charge(ctx(t), []store.Counter{{Key: key, Hits: 1, ExpireAt: hour()}}, make([]store.Result, 2)); err == nil {
		t.Fatal("len(totals) != len(counters) accepted")
	}
	if err := s.Charge(ctx(t), []store.Counter{{Key: key, Hits: 1}}, make([]store.Result, 1)); err == nil {
		t.Fatal("a charge with a zero ExpireAt (a counter that never expires) accepted")
	}
	if err := s.Charge(ctx(t), []store.Counter{{Key: key, Hits: math.MaxInt64 + 1, ExpireAt: hour()}}, make([]store.Result, 1)); err == nil {
		t.Fatal("hits above MaxInt64 accepted")
	}
	if got := charge(t, s, key, 0, hour()); got != 0 {
		t.Fatalf("rejected calls charged %d", got)
	}
}

func testOverflow(t *testing.T, s store.Store, k keyer) {
	key := k.key("o")
	if got := charge(t, s, key, math.MaxInt64, hour()); got != math.MaxInt64 {
		t.Fatalf("charge MaxInt64 = %d", got)
	}
	err := s.Charge(ctx(t), []store.Counter{{Key: key, Hits: 1, ExpireAt: hour()}}, make([]store.Result, 1))
	if !errors.Is(err, store.ErrMalformedReply) {
		t.Fatalf("overflowing add: err = %v, want ErrMalformedReply", err)
	}
	if got := charge(t, s, key, 0, hour()); got != math.MaxInt64 {
		t.Fatalf("counter after a refused overflow = %d, want MaxInt64", got)
	}
}

func testClose(t *testing.T, s store.Store, k keyer) {
	charge(t, s, k.key("x"), 1, hour())
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	err := s.Charge(ctx(t), []store.Counter{{Key: k.key("x"), Hits: 1, ExpireAt: hour()}}, make([]store.Result, 1))
	if err == nil {
		t.Fatal("Charge after Close succeeded")
	}
}
