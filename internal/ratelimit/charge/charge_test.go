package charge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/memory"
)

// events records Unsent classes.
type events struct {
	noEvents
	mu     sync.Mutex
	unsent map[string]uint64
}

func (e *events) Unsent(class string, hits uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.unsent == nil {
		e.unsent = map[string]uint64{}
	}
	e.unsent[class] += hits
}

func (e *events) get(class string) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.unsent[class]
}

// deferStore is a store.Deferrer that records what it was handed.
type deferStore struct {
	store.Store
	mu       sync.Mutex
	deferred []store.Counter
	// refuseUntilDone makes Charge wait for ctx and then refuse the call
	// whole, as the memory store does at its bound.
	refuseUntilDone bool
}

func (d *deferStore) Defer(cs []store.Counter) {
	d.mu.Lock()
	d.deferred = append(d.deferred, cs...)
	d.mu.Unlock()
}

func (d *deferStore) Charge(ctx context.Context, cs []store.Counter, totals []store.Result) error {
	if d.refuseUntilDone {
		<-ctx.Done()
		return fmt.Errorf("%w: full", store.ErrRefused)
	}
	return d.Store.Charge(ctx, cs, totals)
}

func (d *deferStore) deferredHits() (n uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.deferred {
		n += c.Hits
	}
	return n
}

// TestDeadlineBeforeCallDefersHits: a store call whose deadline passed before
// it started sent nothing; its hits go to the store's Deferrer and are
// counted, never dropped silently.
func TestDeadlineBeforeCallDefersHits(t *testing.T) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	ds := &deferStore{Store: mem}
	ev := &events{}
	c, err := New(Options{Store: ds, BatchWorkers: -1, OverLimitCacheSize: -1, Events: ev})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	exp := time.Now().Add(time.Hour)
	err = c.send(ctx, []store.Counter{{Key: "a", Hits: 5, ExpireAt: exp}, {Key: "b", Hits: 0, ExpireAt: exp}}, make([]store.Result, 2))
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	if got := ds.deferredHits(); got != 5 {
		t.Fatalf("deferred %d hits, want 5", got)
	}
	if got := ev.get(UnsentDeferred); got != 5 {
		t.Fatalf("unsent deferred = %d, want 5", got)
	}
	// A store that cannot defer: counted as dropped.
	c2, err := New(Options{Store: mem, BatchWorkers: -1, OverLimitCacheSize: -1, Events: ev})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	nd := struct{ store.Store }{mem} // hides memory's Defer
	c2.st, c2.deferrer = nd, nil
	_ = c2.send(ctx, []store.Counter{{Key: "a", Hits: 3, ExpireAt: exp}}, make([]store.Result, 1))
	if got := ev.get(UnsentDropped); got != 3 {
		t.Fatalf("unsent dropped = %d, want 3", got)
	}
}

// TestRefusedBatchPastDeadlineDefers: a batch refused whole after its
// deadline passed is split per request; those calls start past the deadline,
// so every request's hits are deferred, exactly once.
func TestRefusedBatchPastDeadlineDefers(t *testing.T) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	ds := &deferStore{Store: mem, refuseUntilDone: true}
	ev := &events{}
	c, err := New(Options{Store: ds, BatchWorkers: 1, OverLimitCacheSize: -1, Events: ev, StoreTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Hold the only flusher so the requests below share one batch.
	hold := make(chan struct{})
	c.batch.mu.Lock()
	go func() { <-hold; c.batch.mu.Unlock() }()
	exp := time.Now().Add(time.Hour)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cs := []store.Counter{{Key: fmt.Sprint("k", i), Hits: uint64(i + 1), ExpireAt: exp}}
			if err := c.batch.charge(context.Background(), time.Now(), cs, make([]store.Result, 1)); !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("request %d: err = %v", i, err)
			}
		}(i)
	}
	time.Sleep(5 * time.Millisecond) // stays: they wait on the held lock, which shows nothing to poll (not a correctness bound)
	close(hold)
	wg.Wait()
	c.batch.close()
	// 1+2+3+4 hits: each either deferred once, or (queued past its deadline
	// before the flusher ran) sent as an orphan, refused and counted.
	if got := ds.deferredHits() + ev.get(UnsentRefused); got != 10 {
		t.Fatalf("deferred %d + refused %d hits, want 10 in all", ds.deferredHits(), ev.get(UnsentRefused))
	}
}

// lateStore lets its callers' deadline pass before it hands the call to the
// store it wraps: the deadline passing between the charger's check and the
// store's own (a flusher preempted on a loaded machine) made deterministic.
type lateStore struct {
	store.Store
	calls int
	mu    sync.Mutex
}

func (l *lateStore) Charge(ctx context.Context, cs []store.Counter, totals []store.Result) error {
	l.mu.Lock()
	l.calls++
	l.mu.Unlock()
	<-ctx.Done()
	return l.Store.Charge(ctx, cs, totals)
}

func (l *lateStore) Defer(cs []store.Counter) { l.Store.(store.Deferrer).Defer(cs) }

// TestDeadlinePassingInsideTheCallDefersHits: when a call's deadline passes
// after the charger checked it but before the store did, the store applies
// nothing (store.ErrNotSent) and the hits must still be deferred, counted
// once: before, the store dropped them and no metric saw them (the
// reliability tests' "hits lost" under load). Unbatched and batched paths.
func TestDeadlinePassingInsideTheCallDefersHits(t *testing.T) {
	for _, workers := range []int{-1, 2} {
		t.Run(fmt.Sprint("workers", workers), func(t *testing.T) {
			mem := memory.New(memory.Options{})
			defer mem.Close()
			ls := &lateStore{Store: mem}
			ev := &events{}
			c, err := New(Options{Store: ls, BatchWorkers: workers, OverLimitCacheSize: -1, Events: ev, StoreTimeout: 5 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			exp := time.Now().Add(time.Hour)
			var want uint64
			var wg sync.WaitGroup
			for i := 0; i < 8; i++ {
				h := uint64(i + 1)
				want += h
				wg.Add(1)
				go func() {
					defer wg.Done()
					items := []decide.Item{{Key: []byte(fmt.Sprint("k", h)), Hits: h, Limit: &config.RateLimit{RequestsPerUnit: 1000}, WindowEnd: exp.Unix()}}
					if err := c.Charge(context.Background(), items, time.Now(), &Scratch{}, nil); !errors.Is(err, store.ErrUnavailable) {
						t.Errorf("charge %d: err = %v, want ErrUnavailable", h, err)
					}
				}()
			}
			wg.Wait()
			c.Close() // batched: flushers drain the queue
			if ls.calls == 0 {
				t.Fatal("no call reached the store: the deadline never passed inside a call")
			}
			var got uint64
			for i := 1; i <= 8; i++ {
				totals := make([]store.Result, 1)
				if err := mem.Charge(context.Background(), []store.Counter{{Key: fmt.Sprint("k", i)}}, totals); err != nil {
					t.Fatal(err)
				}
				got += totals[0].Total
			}
			if got != want || ev.get(UnsentDeferred) != want {
				t.Fatalf("stored %d, deferred %d; want %d each: hits of calls whose deadline passed inside the call were lost", got, ev.get(UnsentDeferred), want)
			}
		})
	}
}

// TestReservingCountersNameTheirWindow: a reserving rule's counters carry
// their window's end as Hold.Window, on the check, on the charge and on a
// charge the over-limit cache deferred, so every replica (whatever its
// expiry grace) finds a counter's holds in the same place in the store.
func TestReservingCountersNameTheirWindow(t *testing.T) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	c, err := New(Options{Store: mem, BatchWorkers: -1, Grace: 7 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	now := time.Now()
	end := now.Add(time.Hour).Truncate(time.Hour).Unix()
	limit := &config.RateLimit{RequestsPerUnit: 10, Budget: &config.Budget{Name: "b", Reserve: config.Reserve{Tokens: 4}}}
	items := []decide.Item{
		{Limit: limit, Hits: 0, Reserve: 4, WindowEnd: end, Key: []byte("check")},
		{Limit: limit, Hits: 20, WindowEnd: end, Key: []byte("charge")},
	}
	cs, _ := c.counters(items, now, nil, nil)
	if len(cs) != 2 {
		t.Fatalf("%d counters, want 2", len(cs))
	}
	for _, k := range cs {
		if k.Hold.Window != end || !k.ExpireAt.Equal(time.Unix(end, 0).Add(7*time.Minute)) {
			t.Fatalf("counter %s: window %d, expiry %v; want window %d and the window end + grace", k.Key, k.Hold.Window, k.ExpireAt, end)
		}
	}
	// The over-limit cache keeps the window with a deferred release.
	c.cache.put([]byte("over"), 50, now.Unix(), end, time.Unix(end, 0))
	if !c.cache.hit([]byte("over"), 10, now.Unix(), 3, 1, time.Hour, nil) {
		t.Fatal("the over-limit cache did not take the charge")
	}
	out := c.cache.drain(now.Unix(), nil)
	if len(out) != 1 || out[0].Hold.Release != 1 || out[0].Hold.Window != end {
		t.Fatalf("deferred charges: %+v, want one release with window %d", out, end)
	}
}

// callCounter counts a store's Charge calls.
type callCounter struct {
	store.Store
	calls atomic.Int64
}

func (s *callCounter) Charge(ctx context.Context, cs []store.Counter, totals []store.Result) error {
	s.calls.Add(1)
	return s.Store.Charge(ctx, cs, totals)
}

// TestGoneCallerStillCharges: a request whose caller gave up before its
// store call (Envoy's rate limit timeout passed while it queued) is answered
// nowhere, but the tokens of its stream-done charge were spent: they are
// charged, as the reference charges them (it never looks at the caller's
// context), and its release ends its hold. A check it carries holds nothing,
// and a request of checks alone makes no store call.
func TestGoneCallerStillCharges(t *testing.T) {
	for _, workers := range []int{-1, 2} {
		t.Run(fmt.Sprintf("batch workers %d", workers), func(t *testing.T) {
			mem := memory.New(memory.Options{})
			defer mem.Close()
			st := &callCounter{Store: mem}
			c, err := New(Options{Store: st, BatchWorkers: workers, OverLimitCacheSize: -1})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			exp := now.Add(time.Hour)
			hold := func(reserve, release uint64) store.Hold {
				return store.Hold{Reserve: reserve, Release: release, Expiry: time.Minute, Window: exp.Unix()}
			}
			// A live request holds 10 on "a".
			live := []store.Counter{{Key: "a", Start: true, Limit: 1000, Hold: hold(10, 0), ExpireAt: exp}}
			if err := c.call(context.Background(), live, make([]store.Result, 1)); err != nil {
				t.Fatal(err)
			}
			if r := reservedOf(t, mem, "a", exp, hold(0, 0)); r != 10 {
				t.Fatalf("a holds %d after the live check, want 10", r)
			}
			gone, cancel := context.WithCancel(context.Background())
			cancel()
			before := st.calls.Load()
			checks := []store.Counter{{Key: "b", Start: true, Limit: 1000, Hold: hold(10, 0), ExpireAt: exp}}
			if err := c.call(gone, checks, make([]store.Result, 1)); !errors.Is(err, store.ErrUnavailable) {
				t.Fatalf("checks of a gone caller: err = %v, want ErrUnavailable", err)
			}
			if n := st.calls.Load() - before; n != 0 {
				t.Fatalf("checks of a gone caller made %d store calls, want none", n)
			}
			// The gone caller's charge of 25 on "a" (its request's release)
			// and a reserving check on "b" in the same request.
			charge := []store.Counter{
				{Key: "a", Start: true, Hits: 25, Limit: 1000, Hold: hold(0, 1), ExpireAt: exp},
				{Key: "b", Limit: 1000, Hold: hold(10, 0), ExpireAt: exp},
			}
			_ = c.call(gone, charge, make([]store.Result, 2)) // answered nowhere
			if err := c.Close(); err != nil {                 // drains the batcher's queue
				t.Fatal(err)
			}
			read := make([]store.Result, 2)
			probe := []store.Counter{{Key: "a", Hold: hold(0, 0), ExpireAt: exp}, {Key: "b", Hold: hold(0, 0), ExpireAt: exp}}
			if err := mem.Charge(context.Background(), probe, read); err != nil {
				t.Fatal(err)
			}
			if read[0].Total != 25 {
				t.Errorf("counter a = %d, want 25: the gone caller's tokens were not charged", read[0].Total)
			}
			if read[1].Total != 0 {
				t.Errorf("counter b = %d, want 0", read[1].Total)
			}
			if r := reservedOf(t, mem, "a", exp, hold(0, 0)); r != 0 {
				t.Errorf("a still holds %d, want 0: the gone caller's release did not end its hold", r)
			}
			if r := reservedOf(t, mem, "b", exp, hold(0, 0)); r != 0 {
				t.Errorf("b holds %d, want 0: a gone caller's check placed a hold", r)
			}
		})
	}
}

// reservedOf reads what counter key holds: a reserving check with a limit
// of 0 is always over, so it places nothing and answers the holds.
func reservedOf(t *testing.T, s store.Store, key string, exp time.Time, h store.Hold) uint64 {
	t.Helper()
	res := make([]store.Result, 1)
	h.Reserve, h.Release = 1, 0
	if err := s.Charge(context.Background(), []store.Counter{{Key: key, Start: true, Enforce: true, Hold: h, ExpireAt: exp}}, res); err != nil {
		t.Fatal(err)
	}
	if res[0].Held {
		t.Fatalf("reading %s's holds placed one", key)
	}
	return res[0].Reserved
}
