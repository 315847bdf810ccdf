// Package engine composes the rate limit decision: a request is validated
// and planned by decide, charged by charge (over-limit cache, batching,
// deadlines) against a store.Store, answered by decide.Answer under the
// failure policy, and its outcomes are told to the observers (metrics,
// ledger, thresholds). Errors are typed (decide.InvalidError,
// decide.ErrNoConfig, decide.StoreError); the server maps them to gRPC codes.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/ratelimit/charge"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/observe"
	"github.com/budgetgen/budgetgen/internal/ratelimit/reserve"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
	"github.com/budgetgen/budgetgen/internal/store"
)

// Options configure an Engine. Zero values mean the defaults.
type Options struct {
	// Store holds the counters. Required.
	Store store.Store
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Keys encodes counter keys (format and CACHE_KEY_PREFIX). Default Safe, no prefix.
	Keys key.Encoder
	// Windows places counters in time (WINDOW_MODE, RESET_TIME_ZONE). The
	// zero value is calendar windows in UTC; window.Epoch is the reference's.
	Windows window.Windows
	// NearLimitRatio, default decide.DefaultNearLimitRatio.
	NearLimitRatio float32
	// ShadowMode is the global SHADOW_MODE: an OVER_LIMIT overall code becomes OK.
	ShadowMode bool
	// StoreTimeout is the per-call store deadline, default
	// charge.DefaultStoreTimeout.
	StoreTimeout time.Duration
	// FailurePolicy applies after a store error; default decide.FailAllow.
	FailurePolicy decide.FailurePolicy
	// Grace is added to the window end for counter expiry, default
	// charge.DefaultGrace.
	Grace time.Duration
	// OverLimitCacheSize bounds the local over-limit cache; default
	// charge.DefaultOverLimitCacheSize, negative disables it.
	OverLimitCacheSize int
	// FlushInterval for deferred over-limit charges, default
	// charge.DefaultFlushInterval.
	FlushInterval time.Duration
	// BatchWorkers: see charge.Options.BatchWorkers.
	BatchWorkers int
	// HoldExpiry: see charge.Options.HoldExpiry (RESERVATION_EXPIRY).
	HoldExpiry time.Duration
	// MaxDescriptors, MaxEntries, MaxStringBytes bound requests (defaults
	// decide.DefaultMaxDescriptors, DefaultMaxEntries, DefaultMaxStringBytes).
	MaxDescriptors, MaxEntries, MaxStringBytes int
	// Logger, default slog.Default().
	Logger *slog.Logger
	// Observers, optional, are told every outcome, in order: metrics
	// (observe.Metrics), the ledger and threshold events (observe.Ledger)
	// and the store outage log (observe.StoreWatch) are observers like any
	// other. An observer may also implement observe.Annotator, to add to
	// each counter before it is sent (the ledger's usage rides in the
	// charge's round trip), and charge.Events, to receive the charger's
	// bookkeeping (store latency and errors, cache hits, unsent hits). An
	// observe.Multi is taken apart into its observers.
	Observers []observe.Observer
}

// Engine is safe for concurrent use.
type Engine struct {
	o         Options
	cfg       atomic.Pointer[config.Config]
	planner   decide.Planner
	policy    decide.Policy
	limits    decide.Limits
	charger   *charge.Charger
	reserves  reserve.Learner
	observers observe.Multi
	// annotators are the observers that add to counters; nil when none
	// does, and then no request prepares for them.
	annotators []observe.Annotator
	pool       sync.Pool
}

// New validates options and returns an engine with no config loaded (requests
// fail with decide.ErrNoConfig until SetConfig). Close stops its goroutines.
func New(o Options) (*Engine, error) {
	if o.Store == nil {
		return nil, errors.New("engine: a store is required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NearLimitRatio == 0 {
		o.NearLimitRatio = decide.DefaultNearLimitRatio
	}
	if o.NearLimitRatio < 0 || o.NearLimitRatio > 1 {
		return nil, fmt.Errorf("engine: near limit ratio %v not in [0,1]", o.NearLimitRatio)
	}
	if o.FailurePolicy > decide.FailError {
		return nil, fmt.Errorf("engine: unknown failure policy %d", o.FailurePolicy)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	e := &Engine{o: o, planner: decide.Planner{Keys: o.Keys, Windows: o.Windows},
		policy: decide.Policy{Failure: o.FailurePolicy, ShadowMode: o.ShadowMode, NearLimitRatio: o.NearLimitRatio},
		limits: decide.Limits{MaxDescriptors: o.MaxDescriptors, MaxEntries: o.MaxEntries, MaxStringBytes: o.MaxStringBytes}}
	var events chargeEvents
	e.observers = flatten(nil, o.Observers)
	for _, ob := range e.observers {
		if a, ok := ob.(observe.Annotator); ok {
			e.annotators = append(e.annotators, a)
		}
		if ev, ok := ob.(charge.Events); ok {
			events = append(events, ev)
		}
	}
	c, err := charge.New(charge.Options{Store: o.Store, Now: o.Now, StoreTimeout: o.StoreTimeout, Grace: o.Grace,
		OverLimitCacheSize: o.OverLimitCacheSize, FlushInterval: o.FlushInterval, BatchWorkers: o.BatchWorkers,
		HoldExpiry: o.HoldExpiry, ShadowMode: o.ShadowMode, Events: events.one(), Logger: o.Logger})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e.charger = c
	e.pool.New = func() any { s := new(scratch); s.ann.sc = s; s.ann.e = e; return s }
	return e, nil
}

// SetConfig atomically replaces the active config (nil unloads it). Requests
// in flight finish with the config they started with. Config sources (files,
// xDS) call it after a successful load; a failed load must not call it.
func (e *Engine) SetConfig(c *config.Config) {
	if c != nil {
		e.observers.SetConfig(c)
		buckets := map[string]bool{}
		for _, l := range c.Limits() {
			if l.Budget != nil {
				buckets[l.Budget.Learns()] = true
			}
		}
		e.reserves.Forget(func(b string) bool { return buckets[b] })
	}
	e.cfg.Store(c)
}

// Config returns the active config, nil if none.
func (e *Engine) Config() *config.Config { return e.cfg.Load() }

// Close stops the charger after charging pending over-limit hits. It does
// not close the store.
func (e *Engine) Close() error { return e.charger.Close() }

// Flush charges deferred over-limit hits now (tests and shutdown).
func (e *Engine) Flush() { e.charger.Flush() }

// Limits returns the request shape the engine accepts (defaults applied).
func (e *Engine) Limits() decide.Limits { return e.limits.WithDefaults() }

// Validate checks a request's shape (decide.Validate with the engine's bounds).
func (e *Engine) Validate(req *rlpb.RateLimitRequest) error { return decide.Validate(req, e.limits) }

// scratch is one request's reusable state, and the request in flight
// between Decide and its answer.
type scratch struct {
	plan   decide.Scratch
	charge charge.Scratch
	names  []observe.Names
	desc   observe.Descriptor
	req    observe.Request
	ann    annotator

	ctx   context.Context
	in    *rlpb.RateLimitRequest
	items []decide.Item
	now   time.Time
	reply decide.Replier
}

// annotator tells the observers that annotate (observe.Annotator) about
// each item as it is charged (charge.Annotator), so what they record rides
// in the charge's round trip.
type annotator struct {
	e   *Engine
	sc  *scratch
	req *rlpb.RateLimitRequest
	now time.Time
}

func (a *annotator) descriptor(i int, it *decide.Item) *observe.Descriptor {
	d := &a.sc.desc
	*d = observe.Descriptor{Domain: a.req.Domain, Entries: a.req.Descriptors[i].Entries, Item: it,
		GlobalShadow: a.e.o.ShadowMode, Now: a.now, Names: &a.sc.names[i]}
	return d
}

func (a *annotator) Counter(i int, it *decide.Item, c *store.Counter) {
	d := a.descriptor(i, it)
	for _, an := range a.e.annotators {
		an.Annotate(d, c)
	}
}

func (a *annotator) Cached(i int, it *decide.Item) {
	d := a.descriptor(i, it)
	for _, an := range a.e.annotators {
		an.Cached(d)
	}
}

func (e *Engine) request(ctx context.Context, r *observe.Request) {
	if len(e.observers) > 0 {
		e.observers.Request(ctx, r)
	}
}

// sizeHolds gives each check of a reserving budget the tokens it holds if
// admitted (a check is a descriptor whose hits_addend is explicitly 0: Envoy's
// request-time call, agentgateway's without tokenization), and feeds the
// charges of auto-reserving budgets to their estimate.
func (e *Engine) sizeHolds(items []decide.Item) {
	for i := range items {
		it := &items[i]
		if it.Limit == nil || it.Limit.Budget == nil || !it.Limit.Budget.Reserve.On() {
			continue
		}
		if it.Hits == 0 {
			it.Reserve = e.reserves.Size(it.Limit.Budget)
		} else {
			e.reserves.Observe(it.Limit.Budget, it.Hits)
		}
	}
}

// ShouldRateLimit decides one request and waits for its answer: Decide's.
// Errors are *decide.InvalidError for a malformed request,
// decide.ErrNoConfig when no config is loaded, *decide.StoreError when the
// store failed under FailError.
func (e *Engine) ShouldRateLimit(ctx context.Context, req *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
	w := make(waitReply, 1)
	e.Decide(ctx, req, w)
	r := <-w
	return r.resp, r.err
}

// waitReply is a decide.Replier for a caller that waits.
type waitReply chan replied

type replied struct {
	resp *rlpb.RateLimitResponse
	err  error
}

func (w waitReply) Reply(resp *rlpb.RateLimitResponse, err error) { w <- replied{resp, err} }

// Decide decides one request without waiting for its store call: validate
// -> plan -> charge, then, when the charge ends (on the goroutine that
// ended it: a batch flusher, the deadline's timer, or this one), answer ->
// observe -> r.Reply. Errors are ShouldRateLimit's. req must not change
// until r is called; r may be called before Decide returns.
func (e *Engine) Decide(ctx context.Context, req *rlpb.RateLimitRequest, r decide.Replier) {
	if err := decide.Validate(req, e.limits); err != nil {
		e.request(ctx, &observe.Request{Class: observe.RequestInvalid})
		r.Reply(nil, err)
		return
	}
	cfg := e.cfg.Load()
	if cfg == nil {
		e.request(ctx, &observe.Request{Class: observe.RequestUnavailable})
		r.Reply(nil, decide.ErrNoConfig)
		return
	}
	sc := e.pool.Get().(*scratch)
	now := e.o.Now()
	items := e.planner.Plan(cfg, req, now, &sc.plan)
	e.sizeHolds(items)

	var ann charge.Annotator
	if e.annotators != nil {
		if cap(sc.names) < len(items) {
			sc.names = make([]observe.Names, len(items))
		}
		sc.names = sc.names[:len(items)]
		for i := range sc.names {
			sc.names[i].Reset()
		}
		sc.ann.req, sc.ann.now = req, now
		ann = &sc.ann
	}
	sc.ctx, sc.in, sc.items, sc.now, sc.reply = ctx, req, items, now, r
	e.charger.ChargeAsync(ctx, items, now, &sc.charge, ann, sc)
}

// ChargeDone answers the request in flight on sc (charge.Completer).
func (sc *scratch) ChargeDone(storeErr error) { sc.ann.e.answer(sc, storeErr) }

// answer ends a request whose charge ended: the answer under the failure
// policy, the observers, then the reply; sc goes back to the pool first.
func (e *Engine) answer(sc *scratch, storeErr error) {
	ctx, req, items, now, r := sc.ctx, sc.in, sc.items, sc.now, sc.reply
	if storeErr != nil {
		e.o.Logger.Debug("store charge failed", "domain", req.Domain, "policy", e.o.FailurePolicy.String(), "err", storeErr)
	}
	resp, verdict, err := decide.Answer(items, storeErr, now.Unix(), e.policy)
	if err != nil {
		e.request(ctx, &observe.Request{Class: observe.RequestUnavailable, FailurePolicy: decide.FailError.String()})
	} else if len(e.observers) > 0 {
		e.observe(ctx, sc, storeErr, verdict)
	}
	// Pin no request.
	sc.ann.req, sc.desc = nil, observe.Descriptor{}
	sc.ctx, sc.in, sc.items, sc.reply = nil, nil, nil, nil
	e.pool.Put(sc)
	r.Reply(resp, err)
}

// observe tells the observers a request's outcome.
func (e *Engine) observe(ctx context.Context, sc *scratch, storeErr error, verdict decide.Verdict) {
	req, items := sc.in, sc.items
	d := &sc.desc
	*d = observe.Descriptor{Domain: req.Domain, StoreFailed: storeErr != nil, GlobalShadow: e.o.ShadowMode, Now: sc.now}
	for i := range items {
		if items[i].Limit == nil {
			continue
		}
		d.Entries, d.Item = req.Descriptors[i].Entries, &items[i]
		if e.annotators != nil {
			d.Names = &sc.names[i]
		}
		e.observers.Descriptor(ctx, d)
	}
	r := &sc.req // pooled: an interface call would move a local to the heap
	*r = observe.Request{Class: observe.RequestOK, GlobalShadowed: verdict.GlobalShadowed}
	if verdict.Over {
		r.Class = observe.RequestOverLimit
	}
	switch {
	case storeErr != nil && errors.Is(storeErr, decide.ErrDenied):
		r.FailurePolicy = "store_full_deny" // denied at the store's bound, not by the policy
	case storeErr != nil:
		r.FailurePolicy = e.o.FailurePolicy.String()
	}
	e.observers.Request(ctx, r)
}

// flatten appends obs to out with every observe.Multi taken apart, so each
// observer is checked for the optional interfaces on its own.
func flatten(out observe.Multi, obs []observe.Observer) observe.Multi {
	for _, ob := range obs {
		switch o := ob.(type) {
		case nil:
		case observe.Multi:
			out = flatten(out, o)
		default:
			out = append(out, o)
		}
	}
	return out
}

// chargeEvents tells every observer that keeps the charger's bookkeeping.
type chargeEvents []charge.Events

// one returns nil for none and the observer itself for one, so the usual
// case (metrics only) costs no fan-out on the request path.
func (m chargeEvents) one() charge.Events {
	switch len(m) {
	case 0:
		return nil
	case 1:
		return m[0]
	}
	return m
}

func (m chargeEvents) CacheHit() {
	for _, e := range m {
		e.CacheHit()
	}
}

func (m chargeEvents) CacheFull() {
	for _, e := range m {
		e.CacheFull()
	}
}

func (m chargeEvents) Charged(took time.Duration, err error) {
	for _, e := range m {
		e.Charged(took, err)
	}
}

func (m chargeEvents) Flushed(hits uint64, took time.Duration, err error) {
	for _, e := range m {
		e.Flushed(hits, took, err)
	}
}

func (m chargeEvents) Unsent(class string, hits uint64) {
	for _, e := range m {
		e.Unsent(class, hits)
	}
}

func (m chargeEvents) HoldsExpired(l *config.RateLimit, tokens uint64) {
	for _, e := range m {
		e.HoldsExpired(l, tokens)
	}
}
