package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/budgetgen/budgetgen/internal/ratelimit/charge"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/observe"
	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
	"github.com/budgetgen/budgetgen/internal/schedtest"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/memory"
	valkeystore "github.com/budgetgen/budgetgen/internal/store/valkey"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

const testConfig = `domain: d
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: kill
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: tier
    value: gold
    rate_limit: {unlimited: true, replaces: [{name: per_user}]}
  - key: who
    rate_limit: {unit: hour, requests_per_unit: 2, name: per_user}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
`

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// recStore wraps a store, counting calls and keeping the last counters.
type recStore struct {
	store.Store
	calls atomic.Int64
	mu    sync.Mutex
	last  []store.Counter
	err   error
	block bool
}

func (r *recStore) Charge(ctx context.Context, cs []store.Counter, totals []store.Result) error {
	r.calls.Add(1)
	r.mu.Lock()
	r.last = append([]store.Counter(nil), cs...)
	err, block := r.err, r.block
	r.mu.Unlock()
	if block {
		<-ctx.Done()
		return errors.Join(store.ErrUnavailable, ctx.Err())
	}
	if err != nil {
		return err
	}
	return r.Store.Charge(ctx, cs, totals)
}

type fixture struct {
	e     *Engine
	st    *recStore
	clk   *clock
	reg   *prometheus.Registry
	m     *metrics.Metrics
	total func(k string) uint64
}

// each runs a behaviour test against the embedded memory store and a real
// Valkey server started for it.
func each(t *testing.T, fn func(t *testing.T, kind string)) {
	for _, kind := range []string{"memory", "valkey"} {
		t.Run(kind, func(t *testing.T) { fn(t, kind) })
	}
}

// baseTime is noon UTC tomorrow: counters' absolute expiries computed from
// the injected clock stay in the future of the Valkey server's real clock.
func baseTime() time.Time { return time.Now().UTC().Truncate(24 * time.Hour).Add(36 * time.Hour) }

func newFixture(t *testing.T, kind string, o Options, yaml string) *fixture {
	t.Helper()
	clk := &clock{t: baseTime()}
	var inner store.Store
	var total func(k string) uint64
	switch kind {
	case "memory":
		mem := memory.New(memory.Options{Now: clk.Now})
		inner = mem
		total = func(k string) uint64 {
			tot := []store.Result{{}}
			if err := mem.Charge(context.Background(), []store.Counter{{Key: k}}, tot); err != nil {
				t.Fatal(err)
			}
			return tot[0].Total
		}
	case "valkey":
		srv := valkeytest.Start(t, valkeytest.Options{})
		vs, err := valkeystore.New(valkeystore.Options{Addresses: []string{srv.Addr}, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		inner = vs
		total = func(k string) uint64 {
			v, err := valkeytest.Do(srv.Addr, "GET", k)
			if err != nil {
				t.Fatal(err)
			}
			if v == "(nil)" {
				return 0
			}
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("counter %s = %q", k, v)
			}
			return n
		}
	default:
		t.Fatalf("unknown store %s", kind)
	}
	t.Cleanup(func() { _ = inner.Close() })
	rs := &recStore{Store: inner}
	if o.Store == nil {
		o.Store = rs
	}
	if o.StoreTimeout == 0 && kind == "valkey" {
		o.StoreTimeout = time.Second // a loaded CI box must not flip answers to the failure policy
	}
	o.Now = clk.Now
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	o.Observers = append([]observe.Observer{observe.NewMetrics(m)}, o.Observers...)
	e, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	c, err := config.Load([]config.File{{Name: "t.yaml", Data: []byte(yaml)}})
	if err != nil {
		t.Fatal(err)
	}
	e.SetConfig(c)
	return &fixture{e: e, st: rs, clk: clk, reg: reg, m: m, total: total}
}

func req(domain string, hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rlpb.RateLimitRequest {
	return &rlpb.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: ds}
}

func d(kv ...string) *rlcommon.RateLimitDescriptor {
	out := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func withHits(x *rlcommon.RateLimitDescriptor, h uint64) *rlcommon.RateLimitDescriptor {
	x.HitsAddend = wrapperspb.UInt64(h)
	return x
}

func (f *fixture) call(t *testing.T, r *rlpb.RateLimitRequest) *rlpb.RateLimitResponse {
	t.Helper()
	resp, err := f.e.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

type want struct {
	code      rlpb.RateLimitResponse_Code
	remaining uint32
}

func check(t *testing.T, resp *rlpb.RateLimitResponse, overall rlpb.RateLimitResponse_Code, ws ...want) {
	t.Helper()
	if resp.OverallCode != overall {
		t.Fatalf("overall = %s, want %s (%v)", resp.OverallCode, overall, resp)
	}
	if len(resp.Statuses) != len(ws) {
		t.Fatalf("%d statuses, want %d", len(resp.Statuses), len(ws))
	}
	for i, w := range ws {
		if s := resp.Statuses[i]; s.Code != w.code || s.LimitRemaining != w.remaining {
			t.Fatalf("status %d = %s/%d, want %s/%d", i, s.Code, s.LimitRemaining, w.code, w.remaining)
		}
	}
}

const (
	OK   = rlpb.RateLimitResponse_OK
	OVER = rlpb.RateLimitResponse_OVER_LIMIT
)

func TestPlainHitsCrossingTheLimitStillCharge(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		f := newFixture(t, kind, Options{OverLimitCacheSize: -1}, testConfig)
		for i, w := range []want{{OK, 2}, {OK, 1}, {OK, 0}, {OVER, 0}, {OVER, 0}} {
			resp := f.call(t, req("d", 0, d("user", "alice")))
			code := OK
			if w.code == OVER {
				code = OVER
			}
			check(t, resp, code, w)
			if i == 0 {
				s := resp.Statuses[0]
				if s.CurrentLimit.GetRequestsPerUnit() != 3 || s.CurrentLimit.GetUnit() != rlpb.RateLimitResponse_RateLimit_DAY {
					t.Fatalf("current_limit = %v", s.CurrentLimit)
				}
				if s.DurationUntilReset.GetSeconds() != 12*3600 {
					t.Fatalf("duration_until_reset = %v, want 12h", s.DurationUntilReset)
				}
			}
		}
		k := string(key.Encoder{}.Append(nil, "d", d("user", "alice").Entries, nil, 86400, f.clk.Now().Unix()/86400*86400))
		if got := f.total(k); got != 5 {
			t.Fatalf("counter = %d, want 5: over-limit hits must be charged", got)
		}
		// another principal is independent
		check(t, f.call(t, req("d", 0, d("user", "bob"))), OK, want{OK, 2})
	})
}

func TestHitsAddend(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		f := newFixture(t, kind, Options{OverLimitCacheSize: -1}, testConfig)
		// request-level 0 means 1; 2 charges 2
		check(t, f.call(t, req("d", 2, d("user", "a"))), OK, want{OK, 1})
		// descriptor-level 0 is a check: nothing charged, answered with a read
		check(t, f.call(t, req("d", 0, withHits(d("user", "a"), 0))), OK, want{OK, 1})
		if last := f.st.last; len(last) != 1 || last[0].Hits != 0 {
			t.Fatalf("check-only sent %+v, want one read", last)
		}
		// descriptor-level overrides request-level
		check(t, f.call(t, req("d", 7, withHits(d("user", "a"), 1))), OK, want{OK, 0})
		// check at counter == limit is OK, one more hit is over
		check(t, f.call(t, req("d", 0, withHits(d("user", "a"), 0))), OK, want{OK, 0})
		check(t, f.call(t, req("d", 0, withHits(d("user", "a"), 5))), OVER, want{OVER, 0})
		// check at counter > limit is OVER_LIMIT
		check(t, f.call(t, req("d", 0, withHits(d("user", "a"), 0))), OVER, want{OVER, 0})
		// a check on a fresh principal creates no counter
		check(t, f.call(t, req("d", 0, withHits(d("user", "fresh"), 0))), OK, want{OK, 3})
	})
}

func TestShadowUnlimitedReplacesKillSwitchUnknown(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		f := newFixture(t, kind, Options{OverLimitCacheSize: -1}, testConfig)
		check(t, f.call(t, req("d", 0, d("shadow", "x"))), OK, want{OK, 0})
		resp := f.call(t, req("d", 0, d("shadow", "x")))
		check(t, resp, OK, want{OK, 0})
		if resp.Statuses[0].CurrentLimit == nil {
			t.Fatal("shadow status lost current_limit")
		}
		if got := testutil.ToFloat64(f.m.Decision(metrics.RuleKey{Domain: "d", Rule: "shadow", BudgetKey: metrics.BudgetKey{Window: "day", Mode: metrics.ModeShadow}}, "shadow_over_limit")); got != 1 {
			t.Fatalf("shadow_over_limit metric = %v, want 1", got)
		}
		// unlimited: OK with MaxUint32 remaining, no store call
		calls := f.st.calls.Load()
		resp = f.call(t, req("d", 0, d("free", "x")))
		check(t, resp, OK, want{OK, math.MaxUint32})
		if f.st.calls.Load() != calls || resp.Statuses[0].CurrentLimit != nil {
			t.Fatal("unlimited descriptor touched the store or carried a limit")
		}
		// replaces: tier=gold replaces per_user, so "who" is not limited at all
		for i := 0; i < 4; i++ {
			check(t, f.call(t, req("d", 0, d("who", "w"), d("tier", "gold"))), OK, want{OK, 0}, want{OK, math.MaxUint32})
		}
		check(t, f.call(t, req("d", 0, d("who", "w"))), OK, want{OK, 1})
		// kill switch: requests_per_unit 0 denies any charged hit, a check passes
		check(t, f.call(t, req("d", 0, withHits(d("kill", "x"), 0))), OK, want{OK, 0})
		check(t, f.call(t, req("d", 0, d("kill", "x"))), OVER, want{OVER, 0})
		// unknown domain and unmatched descriptors are OK with no limit
		calls = f.st.calls.Load()
		check(t, f.call(t, req("nope", 0, d("user", "x"))), OK, want{OK, 0})
		check(t, f.call(t, req("d", 0, d("other", "x"), d("user", "x", "deeper", "y"))), OK, want{OK, 0}, want{OK, 0})
		if f.st.calls.Load() != calls {
			t.Fatal("unmatched descriptors touched the store")
		}
		// wildcard
		check(t, f.call(t, req("d", 0, d("path", "/api/a"))), OK, want{OK, 0})
		check(t, f.call(t, req("d", 0, d("path", "/api/a"))), OVER, want{OVER, 0})
		// quota mode answers OK but keeps remaining
		check(t, f.call(t, req("d", 0, d("quota", "q"))), OK, want{OK, 0})
		check(t, f.call(t, req("d", 0, d("quota", "q"))), OK, want{OK, 0})
	})
}

func TestScratchReuseAcrossSizes(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		f := newFixture(t, kind, Options{OverLimitCacheSize: -1}, testConfig)
		// A pooled scratch first used for one counter must grow for three.
		for i := 0; i < 20; i++ {
			u := fmt.Sprint("u", i)
			check(t, f.call(t, req("d", 0, d("user", u))), OK, want{OK, 2})
			check(t, f.call(t, req("d", 0, d("user", u+"x"), d("who", u), d("user", u))), OK, want{OK, 2}, want{OK, 1}, want{OK, 1})
		}
	})
}

func TestGlobalShadowModeOnlyOverallCode(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		f := newFixture(t, kind, Options{ShadowMode: true, OverLimitCacheSize: -1}, testConfig)
		f.call(t, req("d", 0, d("kill", "x")))
		check(t, f.call(t, req("d", 0, d("kill", "x"))), OK, want{OVER, 0})
	})
}

func TestAllDescriptorsInOneStoreCall(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		f := newFixture(t, kind, Options{OverLimitCacheSize: -1}, testConfig)
		before := f.st.calls.Load()
		f.call(t, req("d", 0, d("user", "a"), d("who", "b"), d("kill", "c"), d("free", "x"), d("none", "y")))
		if got := f.st.calls.Load() - before; got != 1 {
			t.Fatalf("%d store calls, want 1", got)
		}
		if len(f.st.last) != 3 {
			t.Fatalf("%d counters in the call, want 3", len(f.st.last))
		}
		now := f.clk.Now().Unix()
		for _, c := range f.st.last {
			var div int64
			switch {
			case strings.Contains(c.Key, "4:user"):
				div = 86400
			case strings.Contains(c.Key, "3:who"):
				div = 3600
			default:
				div = 60
			}
			wantExp := time.Unix(now/div*div+div, 0).Add(charge.DefaultGrace)
			if !c.ExpireAt.Equal(wantExp) {
				t.Fatalf("%s expires %v, want window end + grace %v", c.Key, c.ExpireAt, wantExp)
			}
		}
	})
}

func TestMidnightUTCWindowBoundary(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		f := newFixture(t, kind, Options{OverLimitCacheSize: -1}, testConfig)
		midnight := f.clk.Now().Truncate(24 * time.Hour).Add(24 * time.Hour)
		f.clk.Set(midnight.Add(-100 * time.Millisecond)) // 23:59:59.9 UTC
		for i := 0; i < 4; i++ {
			f.call(t, req("d", 0, d("user", "a")))
		}
		resp := f.call(t, req("d", 0, d("user", "a")))
		check(t, resp, OVER, want{OVER, 0})
		if got := resp.Statuses[0].DurationUntilReset.GetSeconds(); got != 1 {
			t.Fatalf("duration_until_reset at 23:59:59.9 = %d, want 1", got)
		}
		f.clk.Set(midnight) // 00:00:00.0 UTC
		resp = f.call(t, req("d", 0, d("user", "a")))
		check(t, resp, OK, want{OK, 2})
		if got := resp.Statuses[0].DurationUntilReset.GetSeconds(); got != 86400 {
			t.Fatalf("duration_until_reset at 00:00:00.0 = %d, want 86400", got)
		}
		if !strings.HasSuffix(f.st.last[0].Key, fmt.Sprintf("@86400|%d", midnight.Unix())) {
			t.Fatalf("new window key %q does not start at 2026-12-01T00:00:00Z", f.st.last[0].Key)
		}
	})
}

func TestOverLimitCacheSkipsStoreAndStillCharges(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		f := newFixture(t, kind, Options{}, testConfig)
		for i := 0; i < 4; i++ {
			f.call(t, req("d", 0, d("user", "a")))
		}
		calls := f.st.calls.Load()
		for i := 0; i < 10; i++ {
			check(t, f.call(t, req("d", 0, d("user", "a"))), OVER, want{OVER, 0})
			check(t, f.call(t, req("d", 0, withHits(d("user", "a"), 0))), OVER, want{OVER, 0})
		}
		if f.st.calls.Load() != calls {
			t.Fatalf("cached over-limit key still called the store %d times", f.st.calls.Load()-calls)
		}
		f.e.Flush()
		k := string(key.Encoder{}.Append(nil, "d", d("user", "a").Entries, nil, 86400, f.clk.Now().Unix()/86400*86400))
		if got := f.total(k); got != 14 {
			t.Fatalf("counter after flush = %d, want 14 (deferred over-limit hits charged)", got)
		}
		// a mixed request still makes one call and answers the cached one from cache
		check(t, f.call(t, req("d", 0, d("user", "a"), d("user", "b"))), OVER, want{OVER, 0}, want{OK, 2})
		// raising the limit by config reload: the cached total no longer counts as over
		c, _ := config.Load([]config.File{{Name: "t.yaml", Data: []byte(strings.Replace(testConfig, "requests_per_unit: 3}", "requests_per_unit: 100}", 1))}})
		f.e.SetConfig(c)
		f.e.Flush()
		check(t, f.call(t, req("d", 0, d("user", "a"))), OK, want{OK, 100 - 16})
		// the cache ends with the window
		f.clk.Set(f.clk.Now().Truncate(24 * time.Hour).Add(24 * time.Hour))
		f.e.SetConfig(mustConfig(t, testConfig))
		check(t, f.call(t, req("d", 0, d("user", "a"))), OK, want{OK, 2})
	})
}

func mustConfig(t *testing.T, y string) *config.Config {
	c, err := config.Load([]config.File{{Name: "t.yaml", Data: []byte(y)}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestStoreFailurePolicies(t *testing.T) {
	for _, tc := range []struct {
		policy  decide.FailurePolicy
		code    codes.Code
		overall rlpb.RateLimitResponse_Code
	}{{decide.FailAllow, codes.OK, OK}, {decide.FailDeny, codes.OK, OVER}, {decide.FailError, codes.Unavailable, OK}} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			f := newFixture(t, "memory", Options{FailurePolicy: tc.policy, OverLimitCacheSize: -1}, testConfig)
			f.st.block = true
			// The bound is relative to this run: a control sleeping the
			// store deadline beside the call, plus the scheduler's worst
			// lag meanwhile; the failure guarded against is a call that
			// waits on the blocked store for good.
			lag := schedtest.Start()
			control := make(chan time.Duration, 1)
			go func() { t0 := time.Now(); time.Sleep(charge.DefaultStoreTimeout); control <- time.Since(t0) }() // stays: the control
			start := time.Now()
			resp, err := f.e.ShouldRateLimit(context.Background(), req("d", 0, d("user", "a"), d("shadow", "s"), d("none", "x")))
			el := time.Since(start)
			c := <-control
			if _, lagMax := lag.Stop(); el > c+85*time.Millisecond+lagMax {
				t.Fatalf("blocked %v past the %v store deadline (control %v + 85 ms + scheduler lag %v)", el, charge.DefaultStoreTimeout, c, lagMax)
			}
			if status.Code(server.Status(err)) != tc.code {
				t.Fatalf("err = %v, want code %s", err, tc.code)
			}
			if err != nil {
				return
			}
			if resp.OverallCode != tc.overall {
				t.Fatalf("overall %s, want %s", resp.OverallCode, tc.overall)
			}
			if resp.Statuses[1].Code != OK || resp.Statuses[2].Code != OK {
				t.Fatalf("shadow or unlimited descriptor denied: %v", resp.Statuses)
			}
			if got := testutil.ToFloat64(f.m.StoreErrors.WithLabelValues("charge", "timeout")); got != 1 {
				t.Fatalf("store error metric = %v", got)
			}
		})
	}
}

func TestInvalidRequests(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		f := newFixture(t, kind, Options{}, testConfig)
		many := make([]*rlcommon.RateLimitDescriptor, 5000)
		for i := range many {
			many[i] = d("user", "x")
		}
		wide := &rlcommon.RateLimitDescriptor{}
		for i := 0; i < 5000; i++ {
			wide.Entries = append(wide.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
		}
		override := d("user", "x")
		override.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
		cases := map[string]*rlpb.RateLimitRequest{
			"nil":              nil,
			"empty domain":     req("", 0, d("user", "x")),
			"no descriptors":   req("d", 0),
			"many descriptors": req("d", 0, many...),
			"many entries":     req("d", 0, wide),
			"megabyte key":     req("d", 0, d(strings.Repeat("k", 1<<20), "v")),
			"megabyte domain":  req(strings.Repeat("d", 1<<20), 0, d("user", "x")),
			"invalid utf8":     req("d", 0, d("user", "\xff\xfe")),
			"invalid utf8 key": req("d", 0, d("\xc3", "x")),
			"nil descriptor":   req("d", 0, nil),
			"huge hits":        req("d", 0, withHits(d("user", "x"), math.MaxUint64)),
			"override no unit": req("d", 0, override),
		}
		for name, r := range cases {
			t.Run(name, func(t *testing.T) {
				_, err := f.e.ShouldRateLimit(context.Background(), r)
				if status.Code(server.Status(err)) != codes.InvalidArgument || status.Convert(server.Status(err)).Message() == "" {
					t.Fatalf("err = %v, want InvalidArgument with a reason", err)
				}
			})
		}
	})
}

func TestNoConfigIsUnavailable(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		f := newFixture(t, kind, Options{}, testConfig)
		f.e.SetConfig(nil)
		if _, err := f.e.ShouldRateLimit(context.Background(), req("d", 0, d("user", "x"))); status.Code(server.Status(err)) != codes.Unavailable {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestLimitOverride(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		f := newFixture(t, kind, Options{OverLimitCacheSize: -1}, testConfig)
		o := d("anything", "x")
		o.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
		check(t, f.call(t, req("d", 0, o)), OK, want{OK, 0})
		check(t, f.call(t, req("d", 0, o)), OVER, want{OVER, 0})
	})
}

func FuzzShouldRateLimit(f *testing.F) {
	seed := func(r *rlpb.RateLimitRequest) {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	seed(req("d", 0, d("user", "a")))
	seed(req("d", 3, withHits(d("user", "a"), 0), d("tier", "gold"), d("who", "w")))
	seed(req("d", 0, d("path", "/api/x"), d("kill", "k"), d("shadow", "s")))
	f.Add([]byte{0x0a, 0x01, 0xff})
	clk := &clock{t: baseTime()}
	mem := memory.New(memory.Options{Now: clk.Now})
	defer mem.Close()
	e, err := New(Options{Store: mem, Now: clk.Now})
	if err != nil {
		f.Fatal(err)
	}
	defer e.Close()
	c, err := config.Load([]config.File{{Name: "t.yaml", Data: []byte(testConfig)}})
	if err != nil {
		f.Fatal(err)
	}
	e.SetConfig(c)
	f.Fuzz(func(t *testing.T, data []byte) {
		var r rlpb.RateLimitRequest
		if err := (proto.UnmarshalOptions{}).Unmarshal(data, &r); err != nil {
			return
		}
		resp, err := e.ShouldRateLimit(context.Background(), &r)
		if err != nil {
			if c := status.Code(server.Status(err)); c != codes.InvalidArgument {
				t.Fatalf("unexpected error code %s: %v", c, err)
			}
			return
		}
		if len(resp.Statuses) != len(r.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(r.Descriptors))
		}
		if _, err := proto.Marshal(resp); err != nil {
			t.Fatalf("response does not marshal: %v", err)
		}
	})
}

// BenchmarkDecision measures one decision (two descriptors, distinct
// principals) over the memory store, metrics on.
func BenchmarkDecision(b *testing.B) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	e, err := New(Options{Store: mem, Observers: []observe.Observer{observe.NewMetrics(metrics.New(prometheus.NewRegistry()))}})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	c, _ := config.Load([]config.File{{Name: "t.yaml", Data: []byte(strings.NewReplacer("requests_per_unit: 3}", "requests_per_unit: 1000000000}", "requests_per_unit: 2, name", "requests_per_unit: 1000000000, name").Replace(testConfig))}})
	e.SetConfig(c)
	reqs := make([]*rlpb.RateLimitRequest, 10000)
	for i := range reqs {
		u := "user-" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+(i/26)%26)) + string(rune('a'+(i/676)%26))
		reqs[i] = req("d", 0, d("user", u), d("who", u))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := e.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
			b.Fatal(err)
		}
	}
}

// TestValkeyStallBurstStaysWithinDeadline: while Valkey is stopped (SIGSTOP),
// a burst far larger than valkey-go's ring gets its failure-policy answer at
// the store deadline, never seconds later.
func TestValkeyStallBurstStaysWithinDeadline(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	vs, err := valkeystore.New(valkeystore.Options{Addresses: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer vs.Close()
	m := metrics.New(nil)
	e, err := New(Options{Store: vs, OverLimitCacheSize: -1, Observers: []observe.Observer{observe.NewMetrics(m)}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.SetConfig(mustConfig(t, testConfig))
	if _, err := e.ShouldRateLimit(context.Background(), req("d", 0, d("user", "warm"))); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	defer srv.Cont()
	const n = 3000
	var wg sync.WaitGroup
	var slowest, controlSlowest, engineSlowest atomic.Int64
	var notOK atomic.Int64
	// The bound is relative to this run: beside each call a control
	// goroutine, started in the same loop, only sleeps the store deadline,
	// so its slowest is what waking one of 6000 goroutines at the deadline
	// costs on this machine now; every fourth call has a second control, a
	// request no rule matches (the engine's work without the store: under
	// -race that, not the deadline, dominates); a probe adds the
	// scheduler's worst lag.
	lag := schedtest.Start()
	for i := 0; i < n; i++ {
		if i%4 == 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				_, err := e.ShouldRateLimit(context.Background(), req("d", 0, d("unmatched", "control")))
				storeMax(&engineSlowest, time.Since(start))
				if err != nil {
					notOK.Add(1)
				}
			}()
		}
		wg.Add(2)
		go func(i int) {
			defer wg.Done()
			start := time.Now()
			resp, err := e.ShouldRateLimit(context.Background(), req("d", 0, d("user", fmt.Sprint("u", i))))
			storeMax(&slowest, time.Since(start))
			if err != nil || resp.OverallCode != OK {
				notOK.Add(1)
			}
		}(i)
		go func() {
			defer wg.Done()
			start := time.Now()
			time.Sleep(charge.DefaultStoreTimeout) // stays: the control sleeps the store deadline
			storeMax(&controlSlowest, time.Since(start))
		}()
	}
	wg.Wait()
	_, lagMax := lag.Stop()
	s, c, ec := time.Duration(slowest.Load()), time.Duration(controlSlowest.Load()), time.Duration(engineSlowest.Load())
	t.Logf("slowest call %v; controls: sleep %v slowest %v, engine without the store slowest %v; scheduler lag max %v", s, charge.DefaultStoreTimeout, c, ec, lagMax)
	// stallSlack is the rest of the engine's work for 3000 calls at once;
	// the failure guarded against, calls queued behind valkey-go's ring for
	// the stalled connection, takes seconds.
	const stallSlack = 150 * time.Millisecond
	if s > c+ec+stallSlack+lagMax {
		t.Fatalf("slowest call took %v during a Valkey stall: controls %v + %v + %v + scheduler lag %v", s, c, ec, stallSlack, lagMax)
	}
	if notOK.Load() != 0 {
		t.Fatalf("%d calls did not fail open", notOK.Load())
	}
	timeouts := testutil.ToFloat64(m.StoreErrors.WithLabelValues("charge", "timeout")) +
		testutil.ToFloat64(m.StoreErrors.WithLabelValues("charge", "unavailable"))
	if timeouts < n/2 {
		t.Fatalf("only %v store errors counted for %d stalled calls", timeouts, n)
	}
}

// TestConcurrentChargesExact: many concurrent requests, coalesced into
// shared store calls, charge exactly what they ask, and each principal's
// answers follow its own count (exactly limit OKs per principal).
func TestConcurrentChargesExact(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		f := newFixture(t, kind, Options{OverLimitCacheSize: -1, StoreTimeout: 2 * time.Second}, testConfig)
		const principals, perPrincipal = 20, 30
		var wg sync.WaitGroup
		oks := make([]atomic.Int64, principals)
		for p := 0; p < principals; p++ {
			for i := 0; i < perPrincipal; i++ {
				wg.Add(1)
				go func(p int) {
					defer wg.Done()
					resp, err := f.e.ShouldRateLimit(context.Background(), req("d", 0, d("user", fmt.Sprint("c", p)), withHits(d("who", fmt.Sprint("c", p)), 0)))
					if err != nil {
						t.Error(err)
						return
					}
					if resp.Statuses[0].Code == OK {
						oks[p].Add(1)
					}
				}(p)
			}
		}
		wg.Wait()
		for p := 0; p < principals; p++ {
			if got := oks[p].Load(); got != 3 {
				t.Fatalf("principal %d got %d OKs, want exactly the limit 3", p, got)
			}
			k := string(key.Encoder{}.Append(nil, "d", d("user", fmt.Sprint("c", p)).Entries, nil, 86400, f.clk.Now().Unix()/86400*86400))
			if got := f.total(k); got != perPrincipal {
				t.Fatalf("principal %d counter = %d, want %d", p, got, perPrincipal)
			}
		}
	})
}

// TestCounterAtMaximumSaturatesAndDenies: a counter at the store's maximum
// (MaxInt64) cannot take more hits; with the over-limit cache off it is
// answered OVER_LIMIT (saturated), never failed open by the store error,
// and the other descriptors of the request are charged exactly once.
func TestCounterAtMaximumSaturatesAndDenies(t *testing.T) {
	each(t, func(t *testing.T, kind string) {
		// A long store deadline: this test is about saturation, and under
		// -race beside a CPU hog a memory-store call once took over the
		// default 15 ms and was answered by the failure policy.
		f := newFixture(t, kind, Options{OverLimitCacheSize: -1, StoreTimeout: 2 * time.Second}, testConfig)
		day := f.clk.Now().Unix() / 86400 * 86400
		full := string(key.Encoder{}.Append(nil, "d", d("user", "full").Entries, nil, 86400, day))
		exp := time.Unix(day+86400, 0).Add(charge.DefaultGrace)
		if err := f.st.Store.Charge(context.Background(), []store.Counter{{Key: full, Hits: math.MaxInt64, ExpireAt: exp}}, make([]store.Result, 1)); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			check(t, f.call(t, req("d", 0, d("user", "full"))), OVER, want{OVER, 0})
			check(t, f.call(t, req("d", 0, d("user", "full"), d("user", "other"))), OVER, want{OVER, 0}, want{OK, uint32(2 - i)})
		}
		if got := f.total(full); got != math.MaxInt64 {
			t.Fatalf("saturated counter = %d, want MaxInt64", got)
		}
		other := string(key.Encoder{}.Append(nil, "d", d("user", "other").Entries, nil, 86400, day))
		if got := f.total(other); got != 3 {
			t.Fatalf("the other descriptor's counter = %d, want 3 (charged once per request)", got)
		}
		if got := testutil.ToFloat64(f.m.FailurePolicy.WithLabelValues("allow")); got != 0 {
			t.Fatalf("%v requests answered by the failure policy, want 0", got)
		}
	})
}

// recObserver records what the observer seam is told.
type recObserver struct {
	mu       sync.Mutex
	descs    []string
	requests []string
}

func (r *recObserver) Descriptor(_ context.Context, d *observe.Descriptor) {
	r.mu.Lock()
	defer r.mu.Unlock()
	it := d.Item
	r.descs = append(r.descs, fmt.Sprintf("%s hits=%d total=%d over=%v cached=%v failed=%v", it.Limit.Rule, it.Hits, it.Total, it.Over, it.Cached, d.StoreFailed))
}

func (r *recObserver) Request(_ context.Context, q *observe.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = append(r.requests, q.Class+"/"+q.FailurePolicy)
}

// TestObserversToldEachOutcome: an extra observer gets each limited
// descriptor's outcome (never unlimited or unmatched ones) and each
// request's verdict, including invalid requests and store failures.
func TestObserversToldEachOutcome(t *testing.T) {
	ob := &recObserver{}
	f := newFixture(t, "memory", Options{Observers: []observe.Observer{ob}}, testConfig)
	for i := 0; i < 5; i++ {
		f.call(t, req("d", 0, d("user", "o"), d("free", "x"), d("none", "y")))
	}
	_, _ = f.e.ShouldRateLimit(context.Background(), req("", 0, d("user", "o")))
	f.st.block = true
	f.call(t, req("d", 0, d("user", "p")))
	want := []string{
		"d.user hits=1 total=1 over=false cached=false failed=false",
		"d.user hits=1 total=2 over=false cached=false failed=false",
		"d.user hits=1 total=3 over=false cached=false failed=false",
		"d.user hits=1 total=4 over=true cached=false failed=false",
		"d.user hits=1 total=0 over=true cached=true failed=false",
		"d.user hits=1 total=0 over=false cached=false failed=true",
	}
	if fmt.Sprint(ob.descs) != fmt.Sprint(want) {
		t.Fatalf("descriptors:\n got  %q\n want %q", ob.descs, want)
	}
	if got := fmt.Sprint(ob.requests); got != "[ok/ ok/ ok/ over_limit/ over_limit/ invalid_argument/ ok/allow]" {
		t.Fatalf("requests: %s", got)
	}
}

// storeMax raises m to d if d is larger.
func storeMax(m *atomic.Int64, d time.Duration) {
	for {
		cur := m.Load()
		if int64(d) <= cur || m.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// annObserver is an observer that also annotates counters
// (observe.Annotator).
type annObserver struct {
	recObserver
	told []string
}

func (a *annObserver) Annotate(d *observe.Descriptor, c *store.Counter) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c.Ledger = store.HashIncr{Key: "usage", Field: d.Item.Limit.Rule}
	a.told = append(a.told, fmt.Sprintf("annotate %s hits=%d names=%t", d.Item.Limit.Rule, d.Item.Hits, d.Names != nil))
}

func (a *annObserver) Cached(d *observe.Descriptor) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.told = append(a.told, "cached "+d.Item.Limit.Rule)
}

// evObserver is an observer that also keeps the charger's bookkeeping
// (charge.Events).
type evObserver struct {
	recObserver
	hits, charged atomic.Int64
}

func (e *evObserver) CacheHit()                              { e.hits.Add(1) }
func (e *evObserver) CacheFull()                             {}
func (e *evObserver) Charged(time.Duration, error)           { e.charged.Add(1) }
func (e *evObserver) Flushed(uint64, time.Duration, error)   {}
func (e *evObserver) Unsent(string, uint64)                  {}
func (e *evObserver) HoldsExpired(*config.RateLimit, uint64) {}

// TestObserverInterfacesFoundByAssertion: the engine takes one observer
// set; an observer that annotates (even inside an observe.Multi) adds to
// each counter of the very store call that charges it (one call per
// request, the annotation in it) and is told of cached items instead, and
// every observer keeping the charger's bookkeeping gets it.
func TestObserverInterfacesFoundByAssertion(t *testing.T) {
	ann := &annObserver{}
	ev1, ev2 := &evObserver{}, &evObserver{}
	f := newFixture(t, "memory", Options{Observers: []observe.Observer{observe.Multi{ev1, ann}, ev2}}, testConfig)
	for range 5 {
		f.call(t, req("d", 0, d("user", "o")))
	}
	want := []string{
		"annotate d.user hits=1 names=true", "annotate d.user hits=1 names=true", "annotate d.user hits=1 names=true",
		"annotate d.user hits=1 names=true", "cached d.user",
	}
	if fmt.Sprint(ann.told) != fmt.Sprint(want) {
		t.Fatalf("annotator told:\n got  %q\n want %q", ann.told, want)
	}
	if n := f.st.calls.Load(); n != 4 {
		t.Fatalf("%d store calls for 4 charged requests, want 4 (the annotation rides in the charge)", n)
	}
	f.st.mu.Lock()
	last := f.st.last
	f.st.mu.Unlock()
	if len(last) != 1 || last[0].Ledger != (store.HashIncr{Key: "usage", Field: "d.user"}) {
		t.Fatalf("last store call %+v, want the annotation in its counter", last)
	}
	for i, ev := range []*evObserver{ev1, ev2} {
		if ev.charged.Load() != 4 || ev.hits.Load() != 1 {
			t.Fatalf("events observer %d: %d charged, %d cache hits; want 4 and 1", i, ev.charged.Load(), ev.hits.Load())
		}
	}
	if len(ann.descs) != 5 || len(ev1.descs) != 5 || len(ev2.descs) != 5 {
		t.Fatalf("descriptors told: %d, %d, %d; want 5 each", len(ann.descs), len(ev1.descs), len(ev2.descs))
	}
}
