package charge

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/memory"
)

// call sends counters as one request's store call (batched or not) and
// waits for its outcome.
func (c *Charger) call(ctx context.Context, counters []store.Counter, results []store.Result) error {
	w := make(waitDone, 1)
	c.start(ctx, &Scratch{counters: counters, results: results, done: w})
	return <-w
}

// charge queues one request's counters on b and waits for its outcome.
func (b *batcher) charge(_ context.Context, now time.Time, counters []store.Counter, results []store.Result) error {
	w := make(waitDone, 1)
	b.enqueue(&Scratch{counters: counters, results: results, done: w, start: now})
	return <-w
}

// countDone counts completions and keeps the first error.
type countDone struct {
	n     atomic.Int32
	first chan error
}

func newCountDone() *countDone { return &countDone{first: make(chan error, 1)} }

func (d *countDone) ChargeDone(err error) {
	if d.n.Add(1) == 1 {
		d.first <- err
	}
}

// blockStore holds every Charge until released.
type blockStore struct {
	store.Store
	entered chan struct{}
	release chan struct{}
}

func (b *blockStore) Charge(ctx context.Context, c []store.Counter, r []store.Result) error {
	b.entered <- struct{}{}
	<-b.release
	return b.Store.Charge(context.Background(), c, r)
}

// TestChargeAsyncAnswersAtDeadlineOnce: ChargeAsync returns while its store
// call is still in flight; the call is answered by its deadline (the store
// has not returned), exactly once: the late batch does not answer it again,
// and its hits still reach the store.
func TestChargeAsyncAnswersAtDeadlineOnce(t *testing.T) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	bs := &blockStore{Store: mem, entered: make(chan struct{}, 1), release: make(chan struct{})}
	c, err := New(Options{Store: bs, BatchWorkers: 1, OverLimitCacheSize: -1, StoreTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour)
	items := []decide.Item{{Key: []byte("k"), Hits: 3, Limit: &config.RateLimit{RequestsPerUnit: 1000}, WindowEnd: exp.Unix()}}
	d := newCountDone()
	returned := make(chan struct{})
	go func() {
		c.ChargeAsync(context.Background(), items, time.Now(), &Scratch{}, nil, d)
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("ChargeAsync waited for its store call")
	}
	<-bs.entered // the batch is in the store, and stays there
	select {
	case err := <-d.first:
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrUnavailable at the deadline", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not answered at its deadline while its batch was in the store")
	}
	close(bs.release)
	if err := c.Close(); err != nil { // waits for the flusher, so for the late completion
		t.Fatal(err)
	}
	if n := d.n.Load(); n != 1 {
		t.Fatalf("answered %d times, want once", n)
	}
	totals := make([]store.Result, 1)
	if err := mem.Charge(context.Background(), []store.Counter{{Key: "k"}}, totals); err != nil {
		t.Fatal(err)
	}
	if totals[0].Total != 3 {
		t.Fatalf("stored %d hits, want 3", totals[0].Total)
	}
}

// TestReusedPendingIgnoresOldDeadline: a pending answered by its batch and
// reused by a later call is not answered by the first call's deadline.
func TestReusedPendingIgnoresOldDeadline(t *testing.T) {
	c, err := New(Options{Store: memory.New(memory.Options{}), BatchWorkers: -1, OverLimitCacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := &pending{c: c}
	p.state.Store(1 << 1) // generation 1, queued
	if !p.claim() {
		t.Fatal("the batch could not claim a queued call")
	}
	d := newCountDone()
	p.s = &Scratch{done: d}
	p.state.Store(2 << 1) // reused: generation 2, queued
	p.expire(1)
	if n := d.n.Load(); n != 0 {
		t.Fatalf("generation 1's deadline answered generation 2's call %d times", n)
	}
	p.expire(2)
	if n := d.n.Load(); n != 1 {
		t.Fatalf("generation 2's deadline answered it %d times, want once", n)
	}
	if p.claim() {
		t.Fatal("a call answered at its deadline was claimed again")
	}
}
