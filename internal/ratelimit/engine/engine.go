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

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/charge"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/observe"
	"github.com/budgetgen/budgetgen/internal/ratelimit/reserve"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/thresholds"
)

// FailurePolicy is decide.FailurePolicy (settings name it here).
type FailurePolicy = decide.FailurePolicy

// The failure policies.
const (
	FailAllow = decide.FailAllow
	FailDeny  = decide.FailDeny
	FailError = decide.FailError
)

// FailurePolicyNames are the names of the failure policies.
var FailurePolicyNames = decide.FailurePolicyNames

// ParseFailurePolicy parses allow, deny or error; "" is allow.
func ParseFailurePolicy(s string) (FailurePolicy, error) { return decide.ParseFailurePolicy(s) }

// Defaults for Options (see decide and charge).
const (
	DefaultStoreTimeout       = charge.DefaultStoreTimeout
	DefaultNearLimitRatio     = decide.DefaultNearLimitRatio
	DefaultGrace              = charge.DefaultGrace
	DefaultOverLimitCacheSize = charge.DefaultOverLimitCacheSize
	DefaultFlushInterval      = charge.DefaultFlushInterval
	DefaultBatchWorkers       = charge.DefaultBatchWorkers
	DefaultMaxDescriptors     = decide.DefaultMaxDescriptors
	DefaultMaxEntries         = decide.DefaultMaxEntries
	DefaultMaxStringBytes     = decide.DefaultMaxStringBytes
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
	// NearLimitRatio, default DefaultNearLimitRatio.
	NearLimitRatio float32
	// ShadowMode is the global SHADOW_MODE: an OVER_LIMIT overall code becomes OK.
	ShadowMode bool
	// StoreTimeout is the per-call store deadline, default DefaultStoreTimeout.
	StoreTimeout time.Duration
	// FailurePolicy applies after a store error; default FailAllow.
	FailurePolicy FailurePolicy
	// Grace is added to the window end for counter expiry, default DefaultGrace.
	Grace time.Duration
	// OverLimitCacheSize bounds the local over-limit cache; default
	// DefaultOverLimitCacheSize, negative disables it.
	OverLimitCacheSize int
	// FlushInterval for deferred over-limit charges, default DefaultFlushInterval.
	FlushInterval time.Duration
	// BatchWorkers: see charge.Options.BatchWorkers.
	BatchWorkers int
	// HoldExpiry: see charge.Options.HoldExpiry (RESERVATION_EXPIRY).
	HoldExpiry time.Duration
	// MaxDescriptors, MaxEntries, MaxStringBytes bound requests (defaults above).
	MaxDescriptors, MaxEntries, MaxStringBytes int
	// Metrics, optional.
	Metrics *metrics.Metrics
	// Logger, default slog.Default().
	Logger *slog.Logger
	// Ledger, optional, records the shadow-week measurements of day-window
	// rules (internal/ledger): each charge's usage rides in the charge's round
	// trip (store.Counter.Ledger); denials are batched by the Recorder.
	Ledger *ledger.Recorder
	// Thresholds, optional, emits the first crossings of 80/90/100% of a
	// day-window rule's cap (internal/thresholds).
	Thresholds *thresholds.Detector
	// Observers, optional, are told every outcome after the built-in ones
	// (metrics, ledger, thresholds).
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
	ledger    *observe.Ledger // nil when neither ledger nor thresholds
	observers observe.Multi
	pool      sync.Pool
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
		o.NearLimitRatio = DefaultNearLimitRatio
	}
	if o.NearLimitRatio < 0 || o.NearLimitRatio > 1 {
		return nil, fmt.Errorf("engine: near limit ratio %v not in [0,1]", o.NearLimitRatio)
	}
	if o.FailurePolicy > FailError {
		return nil, fmt.Errorf("engine: unknown failure policy %d", o.FailurePolicy)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	e := &Engine{o: o, planner: decide.Planner{Keys: o.Keys, Windows: o.Windows},
		policy: decide.Policy{Failure: o.FailurePolicy, ShadowMode: o.ShadowMode, NearLimitRatio: o.NearLimitRatio},
		limits: decide.Limits{MaxDescriptors: o.MaxDescriptors, MaxEntries: o.MaxEntries, MaxStringBytes: o.MaxStringBytes}}
	var events charge.Events
	if o.Metrics != nil {
		mo := observe.NewMetrics(o.Metrics)
		e.observers = append(e.observers, mo)
		events = mo
	}
	if o.Ledger != nil || o.Thresholds != nil {
		e.ledger = &observe.Ledger{Recorder: o.Ledger, Thresholds: o.Thresholds}
		e.observers = append(e.observers, e.ledger)
	}
	e.observers = append(e.observers, o.Observers...)
	c, err := charge.New(charge.Options{Store: o.Store, Now: o.Now, StoreTimeout: o.StoreTimeout, Grace: o.Grace,
		OverLimitCacheSize: o.OverLimitCacheSize, FlushInterval: o.FlushInterval, BatchWorkers: o.BatchWorkers,
		HoldExpiry: o.HoldExpiry, ShadowMode: o.ShadowMode, Events: events, Logger: o.Logger})
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

// Validate checks a request's shape (decide.Validate with the engine's bounds).
func (e *Engine) Validate(req *rlpb.RateLimitRequest) error { return decide.Validate(req, e.limits) }

// scratch is one request's reusable state.
type scratch struct {
	plan   decide.Scratch
	charge charge.Scratch
	names  []observe.Names
	desc   observe.Descriptor
	req    observe.Request
	ann    annotator
}

// annotator lets the ledger's usage ride in the charge (charge.Annotator).
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
	a.e.ledger.Annotate(a.descriptor(i, it), c)
}

func (a *annotator) Cached(i int, it *decide.Item) { a.e.ledger.Cached(a.descriptor(i, it)) }

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

// ShouldRateLimit decides one request: validate -> plan -> charge -> answer
// -> observe. Errors are *decide.InvalidError for a malformed request,
// decide.ErrNoConfig when no config is loaded, *decide.StoreError when the
// store failed under FailError.
func (e *Engine) ShouldRateLimit(ctx context.Context, req *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
	if err := decide.Validate(req, e.limits); err != nil {
		e.request(ctx, &observe.Request{Class: observe.RequestInvalid})
		return nil, err
	}
	cfg := e.cfg.Load()
	if cfg == nil {
		e.request(ctx, &observe.Request{Class: observe.RequestUnavailable})
		return nil, decide.ErrNoConfig
	}
	sc := e.pool.Get().(*scratch)
	defer e.pool.Put(sc)
	now := e.o.Now()
	items := e.planner.Plan(cfg, req, now, &sc.plan)
	e.sizeHolds(items)

	var ann charge.Annotator
	if e.ledger != nil {
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
	defer func() { sc.ann.req = nil; sc.desc = observe.Descriptor{} }() // pin no request
	storeErr := e.charger.Charge(ctx, items, now, &sc.charge, ann)
	if storeErr != nil {
		e.o.Logger.Debug("store charge failed", "domain", req.Domain, "policy", e.o.FailurePolicy.String(), "err", storeErr)
	}
	resp, verdict, err := decide.Answer(items, storeErr, now.Unix(), e.policy)
	if err != nil {
		e.request(ctx, &observe.Request{Class: observe.RequestUnavailable, FailurePolicy: FailError.String()})
		return nil, err
	}
	if len(e.observers) > 0 {
		d := &sc.desc
		*d = observe.Descriptor{Domain: req.Domain, StoreFailed: storeErr != nil, GlobalShadow: e.o.ShadowMode, Now: now}
		for i := range items {
			if items[i].Limit == nil {
				continue
			}
			d.Entries, d.Item = req.Descriptors[i].Entries, &items[i]
			if e.ledger != nil {
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
	return resp, nil
}
