// Package engine makes rate limit decisions: it matches request descriptors
// against the active config, charges fixed-window counters in one store call
// per request, and answers exactly as envoyproxy/ratelimit does (see
// src/limiter/base_limiter.go, src/redis/fixed_cache_impl.go and
// src/service/ratelimit.go), plus a store deadline, a failure policy and a
// local cache of over-limit counters.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/thresholds"
)

// FailurePolicy is what a request gets when the store fails or misses its
// deadline.
type FailurePolicy uint8

const (
	// FailAllow answers OK (Envoy Gateway's default is fail-open too).
	FailAllow FailurePolicy = iota
	// FailDeny answers OVER_LIMIT for every descriptor that has a limit.
	FailDeny
	// FailError returns gRPC Unavailable; Envoy then applies its own
	// failure_mode_deny.
	FailError
)

// Names of the failure policies (FAILURE_POLICY, --failure-policy).
var FailurePolicyNames = []string{"allow", "deny", "error"}

func (p FailurePolicy) String() string {
	if int(p) < len(FailurePolicyNames) {
		return FailurePolicyNames[p]
	}
	return fmt.Sprintf("FailurePolicy(%d)", p)
}

// ParseFailurePolicy parses allow, deny or error; "" is allow.
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	switch s {
	case "", "allow":
		return FailAllow, nil
	case "deny":
		return FailDeny, nil
	case "error":
		return FailError, nil
	}
	return FailAllow, fmt.Errorf("unknown failure policy %q (want allow, deny or error)", s)
}

// Defaults for Options.
const (
	// DefaultStoreTimeout is below Envoy Gateway's 20 ms RLS timeout, so the
	// failure policy answers before Envoy gives up.
	DefaultStoreTimeout = 15 * time.Millisecond
	// DefaultNearLimitRatio is the reference's NEAR_LIMIT_RATIO.
	DefaultNearLimitRatio = 0.8
	// DefaultGrace is added to the window end for the counter's absolute
	// expiry (the reference's EXPIRATION_JITTER_MAX_SECONDS default is 300 s).
	DefaultGrace = 5 * time.Minute
	// DefaultOverLimitCacheSize bounds the local over-limit cache (entries).
	DefaultOverLimitCacheSize = 100_000
	// DefaultFlushInterval is how often deferred over-limit hits are charged.
	DefaultFlushInterval = 100 * time.Millisecond
	// DefaultBatchWorkers coalesce store calls (see Options.BatchWorkers).
	DefaultBatchWorkers = 4
	// DefaultMaxDescriptors bounds descriptors per request.
	DefaultMaxDescriptors = 512
	// DefaultMaxEntries bounds entries per descriptor.
	DefaultMaxEntries = 256
	// DefaultMaxStringBytes bounds the domain, each key and each value.
	DefaultMaxStringBytes = 8192
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
	// BatchWorkers is the number of goroutines that coalesce concurrent
	// requests' store calls (each sends one store.Charge per batch); default
	// DefaultBatchWorkers, negative sends one store call per request from
	// the request's goroutine.
	BatchWorkers int
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
}

// dayUnit is the window of the rules the ledger and thresholds measure.
const dayUnit = rlpb.RateLimitResponse_RateLimit_DAY

// window is the one place the engine places a counter in time: the window of
// l holding the Unix second now, [start, end). Validate has rejected units
// window does not know, and config only builds known ones.
func (e *Engine) window(l *config.RateLimit, now int64) (start, end int64) {
	start, end, _ = e.o.Windows.Bounds(window.Unit(l.Unit), now)
	return start, end
}

type snapshot struct {
	cfg   *config.Config
	rules []*metrics.Rule // by RateLimit.Index
}

// Engine is safe for concurrent use.
type Engine struct {
	o       Options
	snap    atomic.Pointer[snapshot]
	cache   *overCache
	pool    sync.Pool
	nearF   float32
	stop    chan struct{}
	done    chan struct{}
	closing sync.Once

	overrideMu    sync.Mutex
	overrideRules map[string]*metrics.Rule

	deadlines deadlines
	batch     *batcher // nil when BatchWorkers < 0
}

// New validates options and returns an engine with no config loaded (requests
// fail with Unavailable until SetConfig). Close stops its flusher.
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
	if o.MaxDescriptors <= 0 {
		o.MaxDescriptors = DefaultMaxDescriptors
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.MaxStringBytes <= 0 {
		o.MaxStringBytes = DefaultMaxStringBytes
	}
	if o.FailurePolicy > FailError {
		return nil, fmt.Errorf("engine: unknown failure policy %d", o.FailurePolicy)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	e := &Engine{o: o, cache: newOverCache(o.OverLimitCacheSize), nearF: o.NearLimitRatio,
		stop: make(chan struct{}), done: make(chan struct{}), overrideRules: map[string]*metrics.Rule{}}
	e.pool.New = func() any { return new(scratch) }
	if o.BatchWorkers > 0 {
		e.batch = newBatcher(o.Store, &e.deadlines, o.StoreTimeout, o.BatchWorkers)
	}
	if e.cache != nil {
		go e.flusher()
	} else {
		close(e.done)
	}
	return e, nil
}

// SetConfig atomically replaces the active config (nil unloads it). Requests
// in flight finish with the config they started with. Config sources (files,
// xDS) call it after a successful load; a failed load must not call it.
func (e *Engine) SetConfig(c *config.Config) {
	if c == nil {
		e.snap.Store(nil)
		return
	}
	s := &snapshot{cfg: c, rules: make([]*metrics.Rule, len(c.Limits()))}
	for i, l := range c.Limits() {
		s.rules[i] = e.o.Metrics.ForRule(l.Domain, l.Rule)
	}
	e.snap.Store(s)
}

// Config returns the active config, nil if none.
func (e *Engine) Config() *config.Config {
	if s := e.snap.Load(); s != nil {
		return s.cfg
	}
	return nil
}

// Close stops the flusher after charging pending over-limit hits. It does
// not close the store.
func (e *Engine) Close() error {
	e.closing.Do(func() {
		close(e.stop)
		<-e.done
		if e.batch != nil {
			e.batch.close()
		}
	})
	return nil
}

func (e *Engine) flusher() {
	defer close(e.done)
	t := time.NewTicker(e.o.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			e.Flush()
			return
		case <-t.C:
			e.Flush()
		}
	}
}

// Flush charges deferred over-limit hits now (tests and shutdown).
func (e *Engine) Flush() {
	if e.cache == nil {
		return
	}
	counters := e.cache.drain(e.o.Now().Unix(), nil)
	for len(counters) > 0 {
		n := min(len(counters), 512)
		batch := counters[:n]
		counters = counters[n:]
		totals := make([]uint64, n)
		ctx, cancel := context.WithTimeout(context.Background(), 10*e.o.StoreTimeout)
		start := time.Now()
		err := e.o.Store.Charge(ctx, batch, totals)
		cancel()
		if m := e.o.Metrics; m != nil {
			m.StoreLatency.WithLabelValues("deferred_charge").Observe(time.Since(start).Seconds())
			if err != nil {
				m.StoreErrors.WithLabelValues("deferred_charge", errReason(err)).Inc()
			} else {
				var sum uint64
				for _, c := range batch {
					sum += c.Hits
				}
				m.DeferredCharges.Add(float64(sum))
			}
		}
		if err != nil {
			e.o.Logger.Warn("deferred over-limit charge failed; hits dropped", "counters", n, "err", err)
		}
	}
}

// fullDeny reports a store that refused a new counter at its bound and asks
// for a denial whatever the failure policy (store.ErrFull without
// store.ErrUnavailable): answering by an allow policy would let every new
// principal past the bound through uncounted.
func fullDeny(err error) bool {
	return errors.Is(err, store.ErrFull) && !errors.Is(err, store.ErrUnavailable)
}

func errReason(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, store.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, store.ErrMalformedReply):
		return "malformed_reply"
	case errors.Is(err, store.ErrFull):
		return "full"
	}
	return "other"
}

// oneResponse holds a single-descriptor response and its parts.
type oneResponse struct {
	resp rlpb.RateLimitResponse
	st   [1]rlpb.RateLimitResponse_DescriptorStatus
	p    [1]*rlpb.RateLimitResponse_DescriptorStatus
	d    [1]durationpb.Duration
}

// item is the per-descriptor working state of one request.
type item struct {
	limit     *config.RateLimit
	share     []string
	hits      uint64
	unlimited bool
	cached    bool
	slot      int // index into counters, -1 if none
	keyStart  int
	keyEnd    int
	window    int64  // the window's first second
	end       int64  // the first second after it
	free      uint64 // config.Match.Free
	// ledger names of a day-window rule's descriptor (set when measured)
	lrule      ledger.RuleID
	lprincipal string
	named      bool
}

type scratch struct {
	items    []item
	counters []store.Counter
	totals   []uint64
	keys     []byte
	lookup   []byte
}

// invalid builds an InvalidArgument status.
func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// Validate checks a request's shape: what the reference rejects (empty domain,
// no descriptors) and what it would choke on (too many or too large entries,
// invalid UTF-8, out-of-range hits_addend, a limit override without a unit).
func (e *Engine) Validate(req *rlpb.RateLimitRequest) error {
	if req == nil {
		return invalid("nil request")
	}
	max := e.o.MaxStringBytes
	if req.GetDomain() == "" {
		return invalid("rate limit domain must not be empty")
	}
	if len(req.Domain) > max {
		return invalid("domain is %d bytes, above the %d-byte limit", len(req.Domain), max)
	}
	if !utf8.ValidString(req.Domain) {
		return invalid("domain is not valid UTF-8")
	}
	if len(req.GetDescriptors()) == 0 {
		return invalid("rate limit descriptor list must not be empty")
	}
	if len(req.Descriptors) > e.o.MaxDescriptors {
		return invalid("%d descriptors, above the limit of %d", len(req.Descriptors), e.o.MaxDescriptors)
	}
	for i, d := range req.Descriptors {
		if d == nil {
			return invalid("descriptor %d is null", i)
		}
		if len(d.Entries) > e.o.MaxEntries {
			return invalid("descriptor %d has %d entries, above the limit of %d", i, len(d.Entries), e.o.MaxEntries)
		}
		for j, en := range d.Entries {
			if en == nil {
				return invalid("descriptor %d entry %d is null", i, j)
			}
			if len(en.Key) > max || len(en.Value) > max {
				return invalid("descriptor %d entry %d: key or value above %d bytes", i, j, max)
			}
			if !utf8.ValidString(en.Key) || !utf8.ValidString(en.Value) {
				return invalid("descriptor %d entry %d: key or value is not valid UTF-8", i, j)
			}
		}
		if h := d.GetHitsAddend(); h != nil && h.Value > math.MaxInt64 {
			return invalid("descriptor %d: hits_addend %d above %d", i, h.Value, int64(math.MaxInt64))
		}
		if o := d.GetLimit(); o != nil && config.Divider(config.Unit(o.GetUnit())) == 0 {
			return invalid("descriptor %d: limit override has no valid unit", i)
		}
	}
	return nil
}

// names returns (once per request) the ledger rule and principal of the
// item's descriptor.
func (it *item) names(domain, configRule string, entries []*rlcommon.RateLimitDescriptor_Entry) (ledger.RuleID, string) {
	if !it.named {
		it.lrule, it.lprincipal = ledger.FromDescriptor(domain, configRule, entries, it.free)
		if l := it.limit; l != nil && l.Scope != nil {
			it.lrule, it.lprincipal = ledger.FromScope(l.Scope.Bucket, l.Scope.Principal, l.Scope.Fixed, it.lprincipal)
		}
		it.named = true
	}
	return it.lrule, it.lprincipal
}

// hitsAddend is the reference's utils.GetHitsAddends for one descriptor.
func hitsAddend(req *rlpb.RateLimitRequest, d *rlcommon.RateLimitDescriptor) uint64 {
	if h := d.GetHitsAddend(); h != nil {
		return h.Value // 0 is honoured: check only
	}
	return max(1, uint64(req.GetHitsAddend()))
}

// ShouldRateLimit decides one request. Errors are gRPC statuses:
// InvalidArgument for a malformed request, Unavailable when no config is
// loaded or the store failed under FailError.
func (e *Engine) ShouldRateLimit(ctx context.Context, req *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
	m := e.o.Metrics
	if err := e.Validate(req); err != nil {
		if m != nil {
			m.Requests.WithLabelValues("invalid_argument").Inc()
		}
		return nil, err
	}
	snap := e.snap.Load()
	if snap == nil {
		if m != nil {
			m.Requests.WithLabelValues("unavailable").Inc()
		}
		return nil, status.Error(codes.Unavailable, "no rate limit configuration loaded")
	}
	sc := e.pool.Get().(*scratch)
	defer e.pool.Put(sc)

	nowT := e.o.Now()
	now := nowT.Unix()
	n := len(req.Descriptors)
	if cap(sc.items) < n {
		sc.items = make([]item, n)
	}
	items := sc.items[:n]
	var replacing map[string]struct{}
	for i, d := range req.Descriptors {
		var mt config.Match
		mt, sc.lookup = snap.cfg.Lookup(req.Domain, d, sc.lookup)
		items[i] = item{limit: mt.Limit, share: mt.SharePatterns, hits: hitsAddend(req, d), slot: -1, free: mt.Free}
		if l := mt.Limit; l != nil {
			for _, r := range l.Replaces {
				if replacing == nil {
					replacing = map[string]struct{}{}
				}
				replacing[r] = struct{}{}
			}
			if l.Unlimited {
				items[i].unlimited = true
				items[i].limit = nil
			}
		}
	}
	if replacing != nil {
		for i := range items {
			if l := items[i].limit; l != nil && l.Name != "" {
				if _, ok := replacing[l.Name]; ok {
					items[i].limit = nil
				}
			}
		}
	}

	// Keys, local cache, and the one store call.
	keys := sc.keys[:0]
	counters := sc.counters[:0]
	for i := range items {
		it := &items[i]
		l := it.limit
		if l == nil {
			continue
		}
		it.window, it.end = e.window(l, now)
		it.keyStart = len(keys)
		if sc := l.Scope; sc != nil {
			// A budget map names this rule: one counter per (bucket, principal, window).
			keys = e.o.Keys.AppendBudget(keys, sc.Bucket, sc.Principal, sc.Fixed, req.Descriptors[i].Entries, it.free, it.end-it.window, it.window)
		} else {
			// The key names the window by its start and length, so a calendar
			// window that equals an epoch one (a UTC day) keeps the same counter.
			keys = e.o.Keys.Append(keys, req.Domain, req.Descriptors[i].Entries, it.share, it.end-it.window, it.window)
		}
		it.keyEnd = len(keys)
		if e.cache != nil && e.cache.hit(keys[it.keyStart:it.keyEnd], uint64(l.RequestsPerUnit), now, it.hits) {
			it.cached = true
			if m != nil {
				m.CacheHits.Inc()
			}
			if lg := e.o.Ledger; lg != nil && it.hits > 0 && l.Unit == dayUnit {
				// Charged later from the cache: no round trip to ride on.
				r, p := it.names(req.Domain, l.Rule, req.Descriptors[i].Entries)
				lg.Defer(lg.Usage(r, p, nowT, it.hits))
			}
			continue
		}
		it.slot = len(counters)
		c := store.Counter{
			Key:      string(keys[it.keyStart:it.keyEnd]),
			Hits:     it.hits,
			ExpireAt: time.Unix(it.end, 0).Add(e.o.Grace),
		}
		if lg := e.o.Ledger; lg != nil && it.hits > 0 && l.Unit == dayUnit {
			r, p := it.names(req.Domain, l.Rule, req.Descriptors[i].Entries)
			u := lg.Usage(r, p, nowT, it.hits)
			c.Ledger = store.HashIncr{Key: u.Key, Field: u.Field}
		}
		counters = append(counters, c)
	}
	sc.keys = keys
	var storeErr error
	full := false // the store refused a new counter at its bound: deny
	if len(counters) > 0 {
		if cap(sc.totals) < len(counters) {
			sc.totals = make([]uint64, 0, 2*len(counters))
		}
		sc.totals = sc.totals[:len(counters)]
		totals := sc.totals
		start := time.Now()
		if err := ctx.Err(); err != nil {
			storeErr = fmt.Errorf("%w: %w", store.ErrUnavailable, err) // the caller is gone
		} else if e.batch != nil {
			storeErr = e.batch.charge(ctx, start, counters, totals)
		} else {
			storeErr = e.o.Store.Charge(e.deadlines.after(start, e.o.StoreTimeout), counters, totals)
		}
		if m != nil {
			m.ChargeLatency.Observe(time.Since(start).Seconds())
			if storeErr != nil {
				m.StoreErrors.WithLabelValues("charge", errReason(storeErr)).Inc()
			}
		}
		if storeErr != nil {
			e.o.Logger.Debug("store charge failed", "domain", req.Domain, "policy", e.o.FailurePolicy.String(), "err", storeErr)
			if full = fullDeny(storeErr); full {
				if m != nil {
					m.FailurePolicy.WithLabelValues("store_full_deny").Inc()
				}
			} else if e.o.FailurePolicy == FailError {
				clear(counters)
				sc.counters = counters[:0]
				if m != nil {
					m.FailurePolicy.WithLabelValues("error").Inc()
					m.Requests.WithLabelValues("unavailable").Inc()
				}
				return nil, status.Errorf(codes.Unavailable, "rate limit store: %v", storeErr)
			}
			if m != nil && !full {
				m.FailurePolicy.WithLabelValues(e.o.FailurePolicy.String()).Inc()
			}
		}
	}

	var (
		resp     *rlpb.RateLimitResponse
		statuses []rlpb.RateLimitResponse_DescriptorStatus
		ptrs     []*rlpb.RateLimitResponse_DescriptorStatus
		durs     []durationpb.Duration
	)
	if n == 1 {
		// The common single-descriptor answer in one allocation.
		one := new(oneResponse)
		resp, statuses, ptrs, durs = &one.resp, one.st[:], one.p[:], one.d[:]
	} else {
		resp = &rlpb.RateLimitResponse{}
		statuses = make([]rlpb.RateLimitResponse_DescriptorStatus, n)
		ptrs = make([]*rlpb.RateLimitResponse_DescriptorStatus, n)
	}
	resp.OverallCode = rlpb.RateLimitResponse_OK
	for i := range items {
		it := &items[i]
		st := &statuses[i]
		ptrs[i] = st
		st.Code = rlpb.RateLimitResponse_OK
		if it.unlimited {
			st.LimitRemaining = math.MaxUint32
			continue
		}
		l := it.limit
		if l == nil {
			continue
		}
		if durs == nil {
			durs = make([]durationpb.Duration, n)
		}
		durs[i].Seconds = it.end - now
		st.DurationUntilReset = &durs[i]
		st.CurrentLimit = l.Proto
		limit := uint64(l.RequestsPerUnit)
		over := false
		var after uint64
		switch {
		case it.cached:
			over = true
		case storeErr != nil:
			over = e.o.FailurePolicy == FailDeny || full
			if !over {
				st.LimitRemaining = l.RequestsPerUnit
			}
		default:
			after = sc.totals[it.slot]
			if after > limit {
				over = true
				if e.cache != nil && after > 0 {
					if !e.cache.put(keys[it.keyStart:it.keyEnd], after, now, it.end, counters[it.slot].ExpireAt) && m != nil {
						m.OverLimitCache.WithLabelValues("full").Inc()
					}
				}
			} else {
				st.LimitRemaining = uint32(limit - after)
			}
		}
		if l.Unit == dayUnit && (e.o.Ledger != nil || e.o.Thresholds != nil) && (it.cached || storeErr == nil) {
			e.measure(ctx, req.Domain, req.Descriptors[i].Entries, it, l, nowT, over, after)
		}
		rule := e.ruleMetrics(snap, l)
		if rule != nil && it.hits > 0 {
			rule.Tokens.Add(float64(it.hits))
		}
		if over {
			st.Code = rlpb.RateLimitResponse_OVER_LIMIT
			if l.ShadowMode {
				st.Code = rlpb.RateLimitResponse_OK
				if rule != nil {
					rule.ShadowOverLimit.Inc()
				}
			} else if rule != nil {
				rule.OverLimit.Inc()
			}
		} else if rule != nil {
			rule.OK.Inc()
			near := uint64(math.Floor(float64(float32(limit) * e.nearF)))
			if storeErr == nil && after > near {
				rule.NearLimit.Inc()
			}
		}
		if st.Code == rlpb.RateLimitResponse_OVER_LIMIT {
			if l.QuotaMode {
				// The reference's quota mode: report the violation but answer OK
				// (without duration_until_reset, as it rebuilds the status).
				st.Code = rlpb.RateLimitResponse_OK
				st.DurationUntilReset = nil
			} else {
				resp.OverallCode = rlpb.RateLimitResponse_OVER_LIMIT
			}
		}
	}
	clear(counters) // drop key strings so the pool does not pin them
	sc.counters = counters[:0]
	resp.Statuses = ptrs
	if resp.OverallCode == rlpb.RateLimitResponse_OVER_LIMIT && e.o.ShadowMode {
		resp.OverallCode = rlpb.RateLimitResponse_OK
		if m != nil {
			m.GlobalShadow.Inc()
		}
	}
	if m != nil {
		if resp.OverallCode == rlpb.RateLimitResponse_OVER_LIMIT {
			m.RequestsOverLimit.Inc()
		} else {
			m.RequestsOK.Inc()
		}
	}
	return resp, nil
}

// measure feeds the ledger's denial counts and the threshold events of a
// day-window rule. A 429, would-be (shadow) or real, is a request-path check
// (hits 0, Envoy Gateway's token rules) answered over the limit; a
// response-path charge going over is tokens above the cap, not a 429.
// Thresholds need the total after a charge the store answered.
func (e *Engine) measure(ctx context.Context, domain string, entries []*rlcommon.RateLimitDescriptor_Entry, it *item, l *config.RateLimit, now time.Time, over bool, after uint64) {
	if over && it.hits == 0 && e.o.Ledger != nil {
		r, _ := it.names(domain, l.Rule, entries)
		e.o.Ledger.Denied(r, now, l.ShadowMode || e.o.ShadowMode)
	}
	if !it.cached && it.hits > 0 && e.o.Thresholds != nil {
		r, p := it.names(domain, l.Rule, entries)
		e.o.Thresholds.Observe(ctx, thresholds.Charge{
			Domain: r.Domain, Rule: r.Rule, Principal: ledger.PrincipalName(p),
			Limit: uint64(l.RequestsPerUnit), Hits: it.hits, Total: after, Shadow: l.ShadowMode,
		})
	}
}

func (e *Engine) ruleMetrics(s *snapshot, l *config.RateLimit) *metrics.Rule {
	if e.o.Metrics == nil {
		return nil
	}
	if l.Index >= 0 && l.Index < len(s.rules) {
		return s.rules[l.Index]
	}
	// A request-supplied limit override: one series per domain.
	e.overrideMu.Lock()
	defer e.overrideMu.Unlock()
	r := e.overrideRules[l.Rule]
	if r == nil {
		r = e.o.Metrics.ForRule(l.Domain, l.Rule)
		e.overrideRules[l.Rule] = r
	}
	return r
}
