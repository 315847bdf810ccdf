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
// its own batch. Nobody waits: the flusher that gets a batch's totals
// completes each of its requests (the engine answers it from there), so a
// request costs no goroutine wake-up of its own. Each request keeps its own
// deadline: it is answered at its deadline whatever its batch does, and a
// batch's deadline is that of its earliest request. Counters of one request
// stay together and in order, so a store call still holds all descriptors
// of each request it carries.
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

// pending is one queued call, owned by the batcher: its own copy of the
// call's counters, and the call's Scratch (results and completion), which
// whoever answers the call first (its batch, or its deadline) owns.
type pending struct {
	c        *Charger
	counters []store.Counter
	results  []store.Result // sendEach's, when a batch is split
	deadline time.Time
	s        *Scratch
	// state is the call's generation times two, plus one once it is
	// answered: exactly one of the batch and the deadline answers it, and a
	// deadline that fires after the pending is reused finds a newer
	// generation and does nothing.
	state atomic.Uint64
}

var pendingPool = sync.Pool{New: func() any { return new(pending) }}

// claim reports whether the caller is the one to answer p's current call.
func (p *pending) claim() bool {
	s := p.state.Load()
	return s&1 == 0 && p.state.CompareAndSwap(s, s|1)
}

// expire answers generation gen of p with the failure policy's error if
// nothing answered it yet (its deadline passed). p is then never reused:
// its batch may still read it.
func (p *pending) expire(gen uint64) {
	if p.state.CompareAndSwap(gen<<1, gen<<1|1) {
		p.c.complete(p.s, fmt.Errorf("%w: %w", store.ErrUnavailable, context.DeadlineExceeded))
	}
}

func newBatcher(c *Charger, workers int) *batcher {
	b := &batcher{c: c, deadlines: &c.deadlines, timeout: c.o.StoreTimeout}
	b.cond = sync.NewCond(&b.mu)
	for i := 0; i < workers; i++ {
		b.workers.Add(1)
		go b.flusher()
	}
	return b
}

// enqueue queues one call's counters (s.counters) without waiting: the call
// is completed (Charger.complete) by its batch, with its totals in
// s.results, or at its deadline, whichever comes first.
func (b *batcher) enqueue(s *Scratch) {
	// p owns copies: a call answered at its deadline gives s back to its
	// caller while a flusher may still read p.
	p := pendingPool.Get().(*pending)
	p.c, p.s = b.c, s
	p.counters = append(p.counters[:0], s.counters...)
	p.deadline = s.start.Add(b.timeout)
	gen := p.state.Load()>>1 + 1
	p.state.Store(gen << 1)
	b.deadlines.ms(s.start, b.timeout).watch(p, gen)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		// A request still running at shutdown: nothing will send its
		// hits, so they go to the store's Deferrer (counted) like any
		// other certainly-unsent hits.
		b.c.unsent(p.counters)
		if p.claim() {
			b.c.complete(s, fmt.Errorf("%w: charger closed", store.ErrUnavailable))
		}
		return
	}
	b.queue = append(b.queue, p)
	b.mu.Unlock()
	b.cond.Signal()
}

// answer completes p's call with the batch's outcome (its totals in
// results when err is nil), unless its deadline answered it first, and
// recycles p when it did.
func (b *batcher) answer(p *pending, results []store.Result, err error) {
	if !p.claim() {
		// Answered at its deadline: no item reads these results, so the
		// tokens of holds the call found expired are reported here. p is
		// left to the garbage collector.
		if err == nil {
			b.c.reportExpired(p.counters, results)
		}
		return
	}
	s := p.s
	if err == nil {
		copy(s.results, results)
	}
	clear(p.counters)
	p.s, p.c = nil, nil
	pendingPool.Put(p)
	b.c.complete(s, err)
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
			b.answer(p, nil, fmt.Errorf("%w: %w", store.ErrUnavailable, context.DeadlineExceeded))
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
		if cap(p.results) < len(p.counters) {
			p.results = make([]store.Result, len(p.counters))
		}
		res := p.results[:len(p.counters)]
		err := b.c.send(ctx, p.counters, res)
		b.c.refused(p.counters, err, true) // before answer: p may be reused after it
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
