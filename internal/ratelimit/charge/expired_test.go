package charge

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/memory"
)

// expiringStore answers every release as if it found `expired` tokens of
// the counter's older holds expired (store.Result.Expired).
type expiringStore struct {
	store.Store
	expired uint64
	// gate, when set, holds the first Charge until it is closed.
	gate    chan struct{}
	entered chan struct{}
	once    sync.Once
}

func (s *expiringStore) Charge(ctx context.Context, cs []store.Counter, totals []store.Result) error {
	if s.gate != nil {
		first := false
		s.once.Do(func() { first = true })
		if first {
			close(s.entered)
			<-s.gate
		}
		ctx = context.Background()
	}
	if err := s.Store.Charge(ctx, cs, totals); err != nil {
		return err
	}
	for i, c := range cs {
		if c.Hold.Release > 0 {
			totals[i].Expired = s.expired
		}
	}
	return nil
}

// expiredEvents records HoldsExpired per limit.
type expiredEvents struct {
	noEvents
	mu      sync.Mutex
	expired map[*config.RateLimit]uint64
}

func (e *expiredEvents) HoldsExpired(l *config.RateLimit, tokens uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.expired == nil {
		e.expired = map[*config.RateLimit]uint64{}
	}
	e.expired[l] += tokens
}

func (e *expiredEvents) of(l *config.RateLimit) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.expired[l]
}

func reservingLimit() *config.RateLimit {
	return &config.RateLimit{RequestsPerUnit: 10, Budget: &config.Budget{Name: "b", Reserve: config.Reserve{Tokens: 4}}}
}

// chargeItem is a reserving limit's stream-done charge of hits on key.
func chargeItem(l *config.RateLimit, key string, hits uint64, now time.Time) []decide.Item {
	return []decide.Item{{Limit: l, Hits: hits, WindowEnd: now.Add(time.Hour).Unix(), Key: []byte(key)}}
}

// TestFlushReportsExpiredHolds: a charge the over-limit cache answered is
// sent later by the flusher; its release can find the counter's older holds
// expired, and those tokens reach HoldsExpired (the expired-tokens metric)
// with the counter's limit, once.
func TestFlushReportsExpiredHolds(t *testing.T) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	ev := &expiredEvents{}
	c, err := New(Options{Store: &expiringStore{Store: mem, expired: 7}, BatchWorkers: -1, FlushInterval: time.Hour, Events: ev})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := reservingLimit()
	now := time.Now()
	var s Scratch
	over := chargeItem(l, "k", 20, now)
	if err := c.Charge(context.Background(), over, now, &s, nil); err != nil {
		t.Fatal(err)
	}
	if over[0].Expired != 7 || ev.of(l) != 0 {
		t.Fatalf("a sent charge: item expired %d, events %d; want 7 in the item alone", over[0].Expired, ev.of(l))
	}
	cached := chargeItem(l, "k", 5, now)
	if err := c.Charge(context.Background(), cached, now, &s, nil); err != nil {
		t.Fatal(err)
	}
	if !cached[0].Cached || cached[0].Expired != 0 {
		t.Fatalf("second charge: %+v, want answered by the over-limit cache", cached[0])
	}
	c.Flush()
	if got := ev.of(l); got != 7 {
		t.Fatalf("HoldsExpired after the flush = %d, want 7: tokens of holds the flushed release found expired were dropped", got)
	}
	c.Flush() // nothing pending: nothing more
	if got := ev.of(l); got != 7 {
		t.Fatalf("HoldsExpired after a second flush = %d, want 7", got)
	}
}

// TestGoneCallerReportsExpiredHolds: a charge whose caller stopped waiting
// is still sent (TestGoneCallerStillCharges); tokens of holds its release
// found expired are counted exactly once, in the item when the call's
// answer reached it, else through HoldsExpired.
func TestGoneCallerReportsExpiredHolds(t *testing.T) {
	for _, workers := range []int{-1, 2} {
		t.Run(fmt.Sprintf("batch workers %d", workers), func(t *testing.T) {
			mem := memory.New(memory.Options{})
			defer mem.Close()
			ev := &expiredEvents{}
			c, err := New(Options{Store: &expiringStore{Store: mem, expired: 7}, BatchWorkers: workers, OverLimitCacheSize: -1, Events: ev})
			if err != nil {
				t.Fatal(err)
			}
			l := reservingLimit()
			now := time.Now()
			gone, cancel := context.WithCancel(context.Background())
			cancel()
			items := chargeItem(l, "k", 3, now)
			var s Scratch
			_ = c.Charge(gone, items, now, &s, nil) // answered nowhere
			if err := c.Close(); err != nil {       // drains the batcher's queue
				t.Fatal(err)
			}
			if got := items[0].Expired + ev.of(l); got != 7 {
				t.Fatalf("expired tokens counted: item %d + events %d, want 7 in all", items[0].Expired, ev.of(l))
			}
		})
	}
}

// TestOrphansReportExpiredHolds: requests whose deadline passed while they
// queued behind a slow store call are answered by the failure policy, and
// their charges are sent later as orphans; tokens of holds those releases
// found expired reach HoldsExpired, once per release.
func TestOrphansReportExpiredHolds(t *testing.T) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	ev := &expiredEvents{}
	st := &expiringStore{Store: mem, expired: 7, gate: make(chan struct{}), entered: make(chan struct{})}
	c, err := New(Options{Store: st, StoreTimeout: 20 * time.Millisecond, BatchWorkers: -1, OverLimitCacheSize: -1, Events: ev})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := newBatcher(c, 1)
	exp := time.Now().Add(time.Hour)
	other := reservingLimit()
	first := make(chan error, 1)
	go func() {
		first <- b.charge(context.Background(), time.Now(), []store.Counter{{Key: "a", Hits: 1, ExpireAt: exp}}, make([]store.Result, 1))
	}()
	<-st.entered // the only flusher is now stuck in the store
	l := reservingLimit()
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := store.Hold{Release: 1, Expiry: time.Minute, Window: exp.Unix(), Owner: l}
			counters := []store.Counter{{Key: "b", Hits: 2, ExpireAt: exp, Hold: h}, {Key: "c", ExpireAt: exp, Hold: store.Hold{Reserve: 4, Expiry: time.Minute, Owner: other}}}
			_ = b.charge(context.Background(), time.Now(), counters, make([]store.Result, 2)) // past its deadline
		}()
	}
	wg.Wait()
	close(st.gate)
	<-first
	b.close() // flushers drain the queue before they stop
	if got := ev.of(l); got != 70 {
		t.Fatalf("HoldsExpired = %d, want 70 (7 for each of 10 orphaned releases)", got)
	}
	if got := ev.of(other); got != 0 {
		t.Fatalf("HoldsExpired for a check = %d, want 0", got)
	}
}

// TestDeadlineAnsweredCallReportsExpiredHolds: a call answered at its
// deadline while its batch is in the store reads none of that batch's
// results; when the batch returns, tokens of holds its release found
// expired reach HoldsExpired instead, once.
func TestDeadlineAnsweredCallReportsExpiredHolds(t *testing.T) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	ev := &expiredEvents{}
	st := &expiringStore{Store: mem, expired: 7, gate: make(chan struct{}), entered: make(chan struct{})}
	c, err := New(Options{Store: st, StoreTimeout: 20 * time.Millisecond, BatchWorkers: 1, OverLimitCacheSize: -1, Events: ev})
	if err != nil {
		t.Fatal(err)
	}
	l := reservingLimit()
	now := time.Now()
	items := chargeItem(l, "k", 3, now)
	var s Scratch
	done := make(chan error, 1)
	go func() { done <- c.Charge(context.Background(), items, now, &s, nil) }()
	<-st.entered // its batch is in the store
	if err := <-done; err == nil {
		t.Fatal("the call was not answered at its deadline")
	}
	close(st.gate)
	if err := c.Close(); err != nil { // waits for the batch's completion
		t.Fatal(err)
	}
	if items[0].Expired != 0 || ev.of(l) != 7 {
		t.Fatalf("expired tokens counted: item %d, events %d; want 0 and 7", items[0].Expired, ev.of(l))
	}
}
