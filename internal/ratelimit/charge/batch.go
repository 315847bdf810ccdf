package charge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
)

// batcher coalesces the store calls of concurrent requests: requests queue
// their counters, and a few flusher goroutines each take everything queued
// and send it as one store.Charge. Under load a store call carries the
// counters of many requests (one DoMulti, one goroutine and one wake-up in
// the Valkey client instead of one per request); at low load every request is
// its own batch. Each request keeps its own deadline: it stops waiting at
// its deadline whatever its batch does, and a batch's deadline is that of
// its earliest request. Counters of one request stay together and in order,
// so a store call still holds all descriptors of each request it carries.
type batcher struct {
	c         *Charger
	deadlines *deadlines
	timeout   time.Duration

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*pending
	closed  bool
	workers sync.WaitGroup
}

type pending struct {
	counters []store.Counter
	results  []store.Result
	deadline time.Time
	done     chan error
	// state says who reads the results of p's store call: its caller
	// (pendingAnswered) or, once its caller stopped waiting
	// (pendingAbandoned), nobody, so the flusher reports the tokens of
	// holds they found expired itself. Whichever of the two changes it
	// from pendingWaiting first decides.
	state atomic.Int32
}

// States of a pending request.
const (
	pendingWaiting int32 = iota
	pendingAnswered
	pendingAbandoned
)

var pendingPool = sync.Pool{New: func() any { return &pending{done: make(chan error, 1)} }}

func newBatcher(c *Charger, workers int) *batcher {
	b := &batcher{c: c, deadlines: &c.deadlines, timeout: c.o.StoreTimeout}
	b.cond = sync.NewCond(&b.mu)
	for i := 0; i < workers; i++ {
		b.workers.Add(1)
		go b.flusher()
	}
	return b
}

// charge queues one request's counters and waits for its totals or its
// deadline. The returned error wraps store.ErrUnavailable on timeout.
func (b *batcher) charge(ctx context.Context, now time.Time, counters []store.Counter, results []store.Result) error {
	// p owns copies: a request that gives up at its deadline returns while
	// a flusher may still read p, and the caller reuses its buffers.
	p := pendingPool.Get().(*pending)
	p.counters = append(p.counters[:0], counters...)
	if cap(p.results) < len(results) {
		p.results = make([]store.Result, len(results))
	}
	p.results = p.results[:len(results)]
	p.deadline = now.Add(b.timeout)
	p.state.Store(pendingWaiting)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		// A request still running at shutdown: nothing will send its
		// hits, so they go to the store's Deferrer (counted) like any
		// other certainly-unsent hits.
		b.c.unsent(counters)
		return fmt.Errorf("%w: charger closed", store.ErrUnavailable)
	}
	b.queue = append(b.queue, p)
	b.mu.Unlock()
	b.cond.Signal()
	wait := b.deadlines.after(now, b.timeout)
	select {
	case err := <-p.done:
		copy(results, p.results)
		clear(p.counters)
		pendingPool.Put(p)
		return err
	case <-wait.Done():
		return b.abandon(p, fmt.Errorf("%w: %w", store.ErrUnavailable, context.DeadlineExceeded))
	case <-ctx.Done():
		return b.abandon(p, fmt.Errorf("%w: %w", store.ErrUnavailable, ctx.Err()))
	}
}

// abandon is a caller's giving up on p, answered by the failure policy
// (err): its items read no result. If no flusher has answered p yet, the
// one that sends it reports its expired holds (answer), and p is left to
// the garbage collector, never reused (a flusher may still own it). If one
// has, its answer is on its way: it is read here, and its expired holds
// reported, as no item will count them.
func (b *batcher) abandon(p *pending, err error) error {
	if p.state.CompareAndSwap(pendingWaiting, pendingAbandoned) {
		return err
	}
	if callErr := <-p.done; callErr == nil {
		b.c.reportExpired(p.counters, p.results)
	}
	clear(p.counters)
	pendingPool.Put(p)
	return err
}

// answer hands a live request the outcome of its store call (results, its
// part of the batch's; err). A request whose caller stopped waiting
// (abandon) reads nothing: the tokens of holds its call found expired are
// reported here instead.
func (b *batcher) answer(p *pending, results []store.Result, err error) {
	if !p.state.CompareAndSwap(pendingWaiting, pendingAnswered) {
		if err == nil {
			b.c.reportExpired(p.counters, results)
		}
		return
	}
	if err == nil {
		copy(p.results, results)
	}
	p.done <- err
}

// flushBuf is one flusher's buffers, reused batch after batch.
type flushBuf struct {
	batch    []*pending
	counters []store.Counter
	results  []store.Result
	// orphans are the charged counters of requests whose deadline passed
	// while they waited in the queue: their callers were already answered
	// by the failure policy, but their hits were certainly never sent, so
	// they still go to the store (after the live ones) instead of being
	// lost. A store that cannot take them buffers them as unsent.
	orphans []store.Counter
}

func (b *batcher) flusher() {
	defer b.workers.Done()
	var f flushBuf
	for b.take(&f) {
		now := time.Now()
		live, earliest := b.triage(&f, now)
		if len(f.counters) > 0 {
			b.sendBatch(b.deadlines.after(now, earliest.Sub(now)), &f, live)
		}
		clear(f.counters) // drop key strings
		clear(f.orphans)
		clear(f.batch)
		f.batch = f.batch[:0]
	}
}

// take waits for queued requests and moves them to f.batch; false when the
// batcher is closed and nothing is queued.
func (b *batcher) take(f *flushBuf) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.queue) == 0 && !b.closed {
		b.cond.Wait()
	}
	if len(b.queue) == 0 {
		return false
	}
	f.batch, b.queue = b.queue, f.batch[:0]
	return true
}

// triage answers the requests of f.batch whose deadline passed, keeping
// their charged counters as orphans, and puts the live requests' counters
// then the orphans in f.counters. It returns the live requests (in
// f.batch's array) and the batch's deadline: its earliest live request's,
// or a full store timeout for orphans alone.
func (b *batcher) triage(f *flushBuf, now time.Time) (live []*pending, earliest time.Time) {
	f.counters, f.orphans = f.counters[:0], f.orphans[:0]
	live = f.batch[:0]
	for _, p := range f.batch {
		if !now.Before(p.deadline) {
			for _, c := range p.counters {
				if c.Hits > 0 || c.Hold.Release > 0 {
					// Answered by the failure policy: its hits still
					// count, but it holds nothing.
					c.Hold.Reserve, c.Start = 0, true
					f.orphans = append(f.orphans, c)
				}
			}
			p.done <- fmt.Errorf("%w: %w", store.ErrUnavailable, context.DeadlineExceeded)
			continue
		}
		if earliest.IsZero() || p.deadline.Before(earliest) {
			earliest = p.deadline
		}
		f.counters = append(f.counters, p.counters...)
		live = append(live, p)
	}
	if len(live) == 0 && len(f.orphans) > 0 {
		earliest = now.Add(b.timeout)
	}
	f.counters = append(f.counters, f.orphans...)
	return live, earliest
}

// sendBatch charges f.counters in one store call and answers the live
// requests with their totals.
func (b *batcher) sendBatch(ctx context.Context, f *flushBuf, live []*pending) {
	counters, orphans := f.counters, f.orphans
	if cap(f.results) < len(counters) {
		f.results = make([]store.Result, len(counters))
	}
	results := f.results[:len(counters)]
	f.results = results
	err := b.c.send(ctx, counters, results)
	if err != nil && len(live)+len(orphans) > 1 && errors.Is(err, store.ErrRefused) {
		b.sendEach(ctx, live, orphans, results)
		return
	}
	b.c.refused(counters[:len(counters)-len(orphans)], err, true)
	b.c.refused(counters[len(counters)-len(orphans):], err, false)
	if err == nil {
		// Their callers were answered long ago: no item reads these.
		b.c.reportExpired(orphans, results[len(counters)-len(orphans):])
	}
	off := 0
	for _, p := range live {
		n := len(p.counters)
		b.answer(p, results[off:off+n], err)
		off += n
	}
}

// sendEach charges each request of a batch the store refused whole,
// untouched, on its own (the memory store refuses a call needing a new
// counter at its bound): one new principal in a batch must not refuse the
// others (a cardinality flood would otherwise fail existing principals
// open).
func (b *batcher) sendEach(ctx context.Context, live []*pending, orphans []store.Counter, results []store.Result) {
	for _, p := range live {
		// answer copies the results to p.results only if its caller
		// still waits for them.
		res := results[:len(p.counters)]
		err := b.c.send(ctx, p.counters, res)
		b.c.refused(p.counters, err, true) // before answer: p is the caller's again after it
		b.answer(p, res, err)
	}
	for i := range orphans {
		// Answered by the failure policy long ago: a refusal is
		// reported, not silent.
		err := b.c.send(ctx, orphans[i:i+1], results[:1])
		b.c.refused(orphans[i:i+1], err, false)
		if err == nil {
			b.c.reportExpired(orphans[i:i+1], results[:1])
		}
	}
}

func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cond.Broadcast()
	b.workers.Wait()
}
