// Package charge turns a request's planned items (internal/ratelimit/decide)
// into store calls: the over-limit cache answers counters already known over
// their limit (their hits are charged in background batches), the batcher
// coalesces concurrent requests' calls, every call has a deadline, and hits
// that certainly never reached the store are handed to it for later
// (store.Deferrer) instead of being dropped. It depends only on store.Store;
// the failure policy itself is decide.Answer's, applied to the error Charge
// returns.
package charge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/store"
)

// Defaults for Options.
const (
	// DefaultStoreTimeout is below Envoy Gateway's 20 ms RLS timeout, so the
	// failure policy answers before Envoy gives up.
	DefaultStoreTimeout = 15 * time.Millisecond
	// DefaultGrace is added to the window end for the counter's absolute
	// expiry (the reference's EXPIRATION_JITTER_MAX_SECONDS default is 300 s).
	DefaultGrace = 5 * time.Minute
	// DefaultOverLimitCacheSize bounds the local over-limit cache (entries).
	DefaultOverLimitCacheSize = 100_000
	// DefaultFlushInterval is how often deferred over-limit hits are charged.
	DefaultFlushInterval = 100 * time.Millisecond
	// DefaultBatchWorkers coalesce store calls (see Options.BatchWorkers).
	DefaultBatchWorkers = 4
	// DefaultHoldExpiry is how long a reservation is held for a request
	// whose charge never comes (an upstream error, a lost stream-done call).
	DefaultHoldExpiry = 10 * time.Minute
)

// callerGone prepares the counters of a request whose caller gave up before
// its store call (its deadline, e.g. Envoy's rate limit timeout, passed while
// it queued), and reports whether they still need a store call. Its answer
// goes nowhere, so its checks hold nothing; but the hits it carries were
// spent (a stream-done charge Envoy stopped waiting for) and its releases
// end requests that did run, so those are still sent, as the reference sends
// them (it never looks at the caller's context). A request of checks alone
// needs no call: dropping it sheds load under overload and loses nothing.
func callerGone(counters []store.Counter) bool {
	send := false
	for i := range counters {
		counters[i].Hold.Reserve = 0
		if counters[i].Hits > 0 || counters[i].Hold.Release > 0 {
			send = true
		}
	}
	return send
}

// Classes of hits that were in no store call (Events.Unsent).
const (
	// UnsentDeferred: their deadline passed before their store call started;
	// handed to the store's store.Deferrer (the outage buffer).
	UnsentDeferred = "deferred"
	// UnsentDropped: as UnsentDeferred, but the store cannot take them later.
	UnsentDropped = "dropped"
	// UnsentRefused: the store refused them (store.ErrRefused) even alone.
	UnsentRefused = "refused"
	// UnsentSaturated: their counter is at the store's maximum; the store
	// refused them and the item is answered over its limit.
	UnsentSaturated = "saturated"
)

// Events receives the charger's bookkeeping (metrics). Methods are called on
// the request path: keep them cheap.
type Events interface {
	// CacheHit: the over-limit cache answered an item.
	CacheHit()
	// CacheFull: an over-limit total could not be remembered.
	CacheFull()
	// Charged: one request's store call ended (batched or not).
	Charged(took time.Duration, err error)
	// Flushed: a background charge of cached over-limit hits ended.
	Flushed(hits uint64, took time.Duration, err error)
	// Unsent: hits that were in no store call, by class (Unsent* constants).
	Unsent(class string, hits uint64)
	// HoldsExpired: tokens of l's holds that a release found expired after
	// its request's call returned (the store applied it later: a replay of
	// its outage buffer, or its Defer; store.ExpiryReporter); a call's own
	// are in its items (decide.Item.Expired). Called from the store's
	// replayer, or from Defer on the path of a call that missed its
	// deadline: keep it cheap.
	HoldsExpired(l *config.RateLimit, tokens uint64)
}

// Options configure a Charger. Zero values mean the defaults.
type Options struct {
	// Store holds the counters. Required.
	Store store.Store
	// Now is the clock for the over-limit cache. Default time.Now.
	Now func() time.Time
	// StoreTimeout is the per-call store deadline, default DefaultStoreTimeout.
	StoreTimeout time.Duration
	// Grace is added to the window end for counter expiry, default DefaultGrace.
	Grace time.Duration
	// OverLimitCacheSize bounds the over-limit cache; default
	// DefaultOverLimitCacheSize, negative disables it.
	OverLimitCacheSize int
	// FlushInterval for cached over-limit hits, default DefaultFlushInterval.
	FlushInterval time.Duration
	// BatchWorkers is the number of goroutines that coalesce concurrent
	// requests' store calls (each sends one store.Charge per batch); default
	// DefaultBatchWorkers, negative sends one store call per request from
	// the request's goroutine.
	BatchWorkers int
	// HoldExpiry is how long a reservation holds budget for a request whose
	// charge never comes; default DefaultHoldExpiry.
	HoldExpiry time.Duration
	// ShadowMode is the global SHADOW_MODE: no request is denied, so every
	// admitted reserving check holds.
	ShadowMode bool
	// Events, optional.
	Events Events
	// Logger, default slog.Default().
	Logger *slog.Logger
}

// Charger is safe for concurrent use. Close stops its goroutines.
type Charger struct {
	o         Options
	st        store.Store
	deferrer  store.Deferrer // nil when the store cannot take hits later
	ev        Events
	cache     *overCache
	deadlines deadlines
	batch     *batcher // nil when BatchWorkers < 0
	stop      chan struct{}
	done      chan struct{}
	closing   sync.Once
}

// New validates options and starts the batcher and the cache's flusher.
func New(o Options) (*Charger, error) {
	if o.Store == nil {
		return nil, errors.New("charge: a store is required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.StoreTimeout <= 0 {
		o.StoreTimeout = DefaultStoreTimeout
	}
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	if o.OverLimitCacheSize == 0 {
		o.OverLimitCacheSize = DefaultOverLimitCacheSize
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.BatchWorkers == 0 {
		o.BatchWorkers = DefaultBatchWorkers
	}
	if o.HoldExpiry <= 0 {
		o.HoldExpiry = DefaultHoldExpiry
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	c := &Charger{o: o, st: o.Store, ev: o.Events, cache: newOverCache(o.OverLimitCacheSize),
		stop: make(chan struct{}), done: make(chan struct{})}
	c.deferrer, _ = o.Store.(store.Deferrer)
	if c.ev == nil {
		c.ev = noEvents{}
	}
	if r, ok := o.Store.(store.ExpiryReporter); ok {
		r.ReportExpired(c.holdsExpired)
	}
	if o.BatchWorkers > 0 {
		c.batch = newBatcher(c, o.BatchWorkers)
	}
	if c.cache != nil {
		go c.flusher()
	} else {
		close(c.done)
	}
	return c, nil
}

type noEvents struct{}

func (noEvents) CacheHit()                              {}
func (noEvents) CacheFull()                             {}
func (noEvents) Charged(time.Duration, error)           {}
func (noEvents) Flushed(uint64, time.Duration, error)   {}
func (noEvents) Unsent(string, uint64)                  {}
func (noEvents) HoldsExpired(*config.RateLimit, uint64) {}

// holdsExpired is the store's report of holds a late release found expired
// (store.ExpiryReporter): the owner is the counter's limit (counters).
func (c *Charger) holdsExpired(owner any, tokens uint64) {
	if l, ok := owner.(*config.RateLimit); ok && l != nil {
		c.ev.HoldsExpired(l, tokens)
	}
}

// reportExpired hands tokens of holds a call found expired to HoldsExpired,
// for a call whose results reach no item: a charge the over-limit cache
// answered (Flush) or one whose caller stopped waiting (the batcher's
// orphans and abandoned requests). A call whose results reach its items
// counts them there (decide.Item.Expired), never here too.
func (c *Charger) reportExpired(counters []store.Counter, results []store.Result) {
	for i := range counters {
		if results[i].Expired > 0 {
			c.holdsExpired(counters[i].Hold.Owner, results[i].Expired)
		}
	}
}

// Scratch holds a request's counters and results between calls (one per
// request in flight, reused), and the call in flight.
type Scratch struct {
	counters []store.Counter
	results  []store.Result

	// The call in flight (ChargeAsync until its completion).
	items []decide.Item
	now   time.Time
	start time.Time
	done  Completer
}

// Completer receives the outcome of ChargeAsync, exactly once, from
// whichever goroutine ends the call: the caller's (nothing to send), a batch
// flusher's, or the deadline timer's. It must not block.
type Completer interface {
	ChargeDone(err error)
}

// Annotator is told about each limited item as it is charged (the ledger's
// usage, which rides in the same round trip); i is the item's index.
type Annotator interface {
	// Counter may add to item i's counter before it is sent.
	Counter(i int, it *decide.Item, c *store.Counter)
	// Cached: the over-limit cache answered item i; its hits are charged
	// later, in a background batch.
	Cached(i int, it *decide.Item)
}

// Charge charges a planned request and waits for its outcome:
// ChargeAsync's, returned (tests and callers without a completion).
func (c *Charger) Charge(ctx context.Context, items []decide.Item, now time.Time, s *Scratch, ann Annotator) error {
	w := make(waitDone, 1)
	c.ChargeAsync(ctx, items, now, s, ann, w)
	return <-w
}

// waitDone is a Completer for a caller that waits.
type waitDone chan error

func (w waitDone) ChargeDone(err error) { w <- err }

// ChargeAsync charges a planned request without waiting: items the
// over-limit cache knows are marked Cached (their hits charged later), the
// others get a Slot and are sent in one store call (batched with other
// requests'), whose outcome it writes into the items (Total, Reserved,
// Held, Expired) before it calls done.ChargeDone with the store's error, if
// any (wrapping store.ErrUnavailable on a deadline); the items' outcomes are
// then meaningless and decide.Answer applies the failure policy. items and
// s belong to the charger until done is called, which can happen before
// ChargeAsync returns. ann may be nil.
func (c *Charger) ChargeAsync(ctx context.Context, items []decide.Item, now time.Time, s *Scratch, ann Annotator, done Completer) {
	counters, denied := c.counters(items, now, s.counters[:0], ann)
	s.counters = counters
	if len(counters) == 0 {
		done.ChargeDone(nil)
		return
	}
	if denied {
		// An enforcing item is over (the cache knew): the request is
		// denied, so its checks hold nothing.
		for i := range counters {
			counters[i].Hold.Reserve = 0
		}
	}
	if cap(s.results) < len(counters) {
		s.results = make([]store.Result, 0, 2*len(counters))
	}
	s.results = s.results[:len(counters)]
	s.items, s.now, s.done = items, now, done
	c.start(ctx, s)
}

// start sends s.counters (batched, or on their own) and completes s when
// they return or their deadline passes.
func (c *Charger) start(ctx context.Context, s *Scratch) {
	s.start = time.Now()
	if cerr := ctx.Err(); cerr != nil && !callerGone(s.counters) {
		c.end(s, fmt.Errorf("%w: %w", store.ErrUnavailable, cerr)) // nothing to charge
		return
	}
	if c.batch != nil {
		c.batch.enqueue(s)
		return
	}
	// One store call per request: on its own goroutine, so that the
	// caller (a connection's read loop) never waits for the store.
	go func() {
		err := c.send(c.deadlines.after(s.start, c.o.StoreTimeout), s.counters, s.results)
		c.refused(s.counters, err, true)
		c.complete(s, err)
	}()
}

// complete ends a call whose store call returned (or whose deadline
// passed): it maps the store's refusals, writes the totals into the items
// and remembers the counters over their limit.
func (c *Charger) complete(s *Scratch, err error) {
	counters, results := s.counters, s.results
	if err != nil && errors.Is(err, store.ErrOverflow) {
		err = c.saturate(counters, results, err)
	}
	if err != nil && errors.Is(err, store.ErrFull) && !errors.Is(err, store.ErrUnavailable) {
		// A bounded store refused a new counter and asks to enforce: deny,
		// whatever the failure policy.
		err = fmt.Errorf("%w: %w", decide.ErrDenied, err)
	}
	c.ev.Charged(time.Since(s.start), err)
	if err == nil {
		unix := s.now.Unix()
		for i := range s.items {
			it := &s.items[i]
			if it.Limit == nil || it.Cached {
				continue
			}
			r := &results[it.Slot]
			it.Total, it.Reserved, it.Held, it.Expired = r.Total, r.Reserved, r.Held, r.Expired
			if c.cache != nil && r.Total > uint64(it.Limit.RequestsPerUnit) {
				if !c.cache.put(it.Key, r.Total, unix, it.WindowEnd, counters[it.Slot].ExpireAt) {
					c.ev.CacheFull()
				}
			}
		}
	}
	c.end(s, err)
}

// end gives s back to its caller and tells it err.
func (c *Charger) end(s *Scratch, err error) {
	done := s.done
	clear(s.counters) // drop key strings so the pool does not pin them
	s.counters, s.items, s.done = s.counters[:0], nil, nil
	done.ChargeDone(err)
}

// counters builds a request's store counters from its items; denied tells
// that the over-limit cache answered an enforcing item (the request is
// denied whatever the store says).
func (c *Charger) counters(items []decide.Item, now time.Time, counters []store.Counter, ann Annotator) (_ []store.Counter, denied bool) {
	unix := now.Unix()
	for i := range items {
		it := &items[i]
		l := it.Limit
		if l == nil {
			continue
		}
		reserving := l.Budget != nil && l.Budget.Reserve.On()
		release := uint64(0)
		if reserving && it.Hits > 0 {
			release = 1
		}
		enforce := !l.ShadowMode && !l.QuotaMode && !c.o.ShadowMode
		if c.cache != nil && c.cache.hit(it.Key, uint64(l.RequestsPerUnit), unix, it.Hits, release, c.o.HoldExpiry, l) {
			it.Cached = true
			denied = denied || enforce
			c.ev.CacheHit()
			if ann != nil {
				ann.Cached(i, it)
			}
			continue
		}
		it.Slot = len(counters)
		k := store.Counter{Key: string(it.Key), Hits: it.Hits, ExpireAt: c.expireAt(it), Start: len(counters) == 0,
			Limit: uint64(l.RequestsPerUnit), Enforce: enforce}
		if reserving {
			// Owner: the store hands the limit back with holds its
			// replay of this release finds expired (holdsExpired).
			k.Hold = store.Hold{Release: release, Expiry: c.o.HoldExpiry, Window: it.WindowEnd, Owner: l}
			if it.Hits == 0 {
				k.Hold.Reserve = it.Reserve
			}
		}
		counters = append(counters, k)
		if ann != nil {
			ann.Counter(i, it, &counters[len(counters)-1])
		}
	}
	return counters, denied
}

// saturate answers a call that failed because a counter is at the store's
// maximum: that counter's total is MaxInt64 (over any limit: denied, never
// failed open); the others get their real totals. A store that refused the
// call whole (store.ErrRefused) applied nothing, so the other counters are
// charged again on their own; otherwise they were applied and are read.
func (c *Charger) saturate(counters []store.Counter, results []store.Result, callErr error) error {
	read := make([]store.Counter, len(counters))
	for i, k := range counters {
		read[i] = store.Counter{Key: k.Key, ExpireAt: k.ExpireAt}
	}
	if err := c.st.Charge(c.deadlines.after(time.Now(), c.o.StoreTimeout), read, results); err != nil {
		return callErr
	}
	refused := errors.Is(callErr, store.ErrRefused)
	var again []store.Counter
	var at []int
	for i, k := range counters {
		if k.Hits > 0 && results[i].Total > math.MaxInt64-k.Hits {
			results[i] = store.Result{Total: math.MaxInt64}
			if refused {
				c.ev.Unsent(UnsentSaturated, k.Hits) // a store that refused did not count them
			}
			continue
		}
		if refused && k.Hits > 0 {
			again = append(again, k)
			at = append(at, i)
		}
	}
	if len(again) > 0 {
		sub := make([]store.Result, len(again))
		if err := c.send(c.deadlines.after(time.Now(), c.o.StoreTimeout), again, sub); err != nil {
			return err
		}
		for j, i := range at {
			results[i] = sub[j]
		}
	}
	return nil
}

func (c *Charger) expireAt(it *decide.Item) time.Time {
	return time.Unix(it.WindowEnd, 0).Add(c.o.Grace)
}

// send is every store call that charges hits: a call whose deadline passed
// before it started certainly sends nothing, so its hits go to the store's
// Deferrer (the outage buffer) rather than being lost. The deadline can
// also pass between this check and the store's own one (a preempted
// flusher on a loaded machine): the store then returns store.ErrNotSent,
// having kept nothing, and the hits are deferred the same way.
func (c *Charger) send(ctx context.Context, counters []store.Counter, results []store.Result) error {
	if err := ctx.Err(); err != nil {
		c.unsent(counters)
		return fmt.Errorf("%w: deadline passed before the store call: %w", store.ErrUnavailable, err)
	}
	err := c.st.Charge(ctx, counters, results)
	if err != nil && errors.Is(err, store.ErrNotSent) {
		c.unsent(counters)
	}
	return err
}

// refused counts the hits of a call the store refused (store.ErrRefused):
// they are in no counter. A waiting request's overflow is not counted here:
// saturate answers it and charges its other counters.
func (c *Charger) refused(counters []store.Counter, err error, waiting bool) {
	if err == nil || !errors.Is(err, store.ErrRefused) || (waiting && errors.Is(err, store.ErrOverflow)) {
		return
	}
	if n := sumHits(counters); n > 0 {
		c.ev.Unsent(UnsentRefused, n)
	}
}

// unsent hands hits that were in no store call to the store's Deferrer.
func (c *Charger) unsent(counters []store.Counter) {
	hits := sumHits(counters)
	if hits == 0 {
		return
	}
	if c.deferrer == nil {
		c.ev.Unsent(UnsentDropped, hits)
		c.o.Logger.Warn("charge: store call past its deadline and the store cannot defer: hits dropped", "hits", hits)
		return
	}
	c.deferrer.Defer(counters)
	c.ev.Unsent(UnsentDeferred, hits)
}

func sumHits(counters []store.Counter) uint64 {
	var n uint64
	for _, k := range counters {
		n += k.Hits
	}
	return n
}

// Close charges pending over-limit hits and stops the goroutines. It does
// not close the store.
func (c *Charger) Close() error {
	c.closing.Do(func() {
		close(c.stop)
		<-c.done
		if c.batch != nil {
			c.batch.close()
		}
	})
	return nil
}

func (c *Charger) flusher() {
	defer close(c.done)
	t := time.NewTicker(c.o.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			c.Flush()
			return
		case <-t.C:
			c.Flush()
		}
	}
}

// Flush charges cached over-limit hits now (tests and shutdown).
func (c *Charger) Flush() {
	if c.cache == nil {
		return
	}
	counters := c.cache.drain(c.o.Now().Unix(), nil)
	for len(counters) > 0 {
		n := min(len(counters), 512)
		batch := counters[:n]
		counters = counters[n:]
		results := make([]store.Result, n)
		ctx, cancel := context.WithTimeout(context.Background(), 10*c.o.StoreTimeout)
		start := time.Now()
		err := c.send(ctx, batch, results)
		cancel()
		c.ev.Flushed(sumHits(batch), time.Since(start), err)
		if err == nil {
			c.reportExpired(batch, results) // no request reads them
		} else {
			// The store accounts for what it did not apply (its outage
			// buffer and loss counters).
			c.o.Logger.Warn("deferred over-limit charge failed", "counters", n, "err", err)
		}
	}
}
