package charge

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/memory"
)

// gateStore holds its first Charge until released, so later requests wait in
// the batcher's queue past their deadline.
type gateStore struct {
	store.Store
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (g *gateStore) Charge(ctx context.Context, c []store.Counter, totals []store.Result) error {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.release
	}
	return g.Store.Charge(context.Background(), c, totals)
}

// TestQueuedPastDeadlineStillCharged: a request whose deadline passes while it
// waits behind a slow store call is answered by the failure policy, but its
// hits were never sent, so they must still reach the store, exactly once.
func TestQueuedPastDeadlineStillCharged(t *testing.T) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	g := &gateStore{Store: mem, entered: make(chan struct{}), release: make(chan struct{})}
	c, err := New(Options{Store: g, StoreTimeout: 20 * time.Millisecond, BatchWorkers: -1, OverLimitCacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	b := newBatcher(c, 1)
	exp := time.Now().Add(time.Hour)

	first := make(chan error, 1)
	go func() {
		first <- b.charge(context.Background(), time.Now(), []store.Counter{{Key: "a", Hits: 1, ExpireAt: exp}}, make([]store.Result, 1))
	}()
	<-g.entered // the only flusher is now stuck in the store

	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			counters := []store.Counter{{Key: "b", Hits: 7, ExpireAt: exp}, {Key: "c", Hits: 0, ExpireAt: exp}}
			errs[i] = b.charge(context.Background(), time.Now(), counters, make([]store.Result, 2))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("queued request %d: err = %v, want ErrUnavailable at its deadline", i, err)
		}
	}
	close(g.release)
	<-first
	b.close() // flushers drain the queue before they stop

	totals := make([]store.Result, 3)
	if err := mem.Charge(context.Background(), []store.Counter{{Key: "a"}, {Key: "b"}, {Key: "c"}}, totals); err != nil {
		t.Fatal(err)
	}
	if totals[0].Total != 1 || totals[1].Total != 70 || totals[2].Total != 0 {
		t.Fatalf("totals a, b, c = %v, want [1 70 0]: hits of requests answered at their deadline were lost or doubled", totals)
	}
}

// TestChargeAfterCloseDefers: a request still running when the charger has
// closed (shutdown past the server's grace) is answered by the failure
// policy; nothing will send its hits, so they are deferred, not dropped.
func TestChargeAfterCloseDefers(t *testing.T) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	ds := &deferStore{Store: mem}
	ev := &events{}
	c, err := New(Options{Store: ds, OverLimitCacheSize: -1, Events: ev})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour)
	err = c.batch.charge(context.Background(), time.Now(), []store.Counter{{Key: "a", Hits: 4, ExpireAt: exp}, {Key: "b", ExpireAt: exp}}, make([]store.Result, 2))
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	if ds.deferredHits() != 4 || ev.get(UnsentDeferred) != 4 {
		t.Fatalf("deferred %d hits (event %d), want 4", ds.deferredHits(), ev.get(UnsentDeferred))
	}
}
