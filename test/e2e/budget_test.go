// Package e2e runs the whole budget path: the example spec is rendered into
// Envoy Gateway and agentgateway policies, the rate limit service config
// Envoy Gateway would derive from its policies (xDS) and the files render
// writes for agentgateway's domain are loaded into one service (over gRPC on
// loopback, counters in a real Valkey), and a day of traffic is sent as each
// gateway would send it: Envoy's request-time check (descriptor hits_addend
// 0) and, for admitted requests, a stream-done charge with the token count;
// agentgateway's check (hits 0, the prompt was not tokenized) and its amend.
package e2e

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/engine"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/observe"
	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
	"github.com/budgetgen/budgetgen/internal/ratelimit/source"
	"github.com/budgetgen/budgetgen/internal/rlsconfig"
	"github.com/budgetgen/budgetgen/internal/store/valkey"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

const (
	examplePath = "../../examples/budgets.yaml"
	tokenMeta   = "io.envoy.ai_gateway:llm_total_token"
	cheapModel  = "gpt-4o-mini"
)

// clock is the service's injected clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// world is one rendered spec served by one service instance.
type world struct {
	t      *testing.T
	clock  *clock
	client rlsv3.RateLimitServiceClient
	reg    *prometheus.Registry
	btp    *egv1a1.BackendTrafficPolicy
	routes map[string][]*routev3.RateLimit
	agw    *agentgateway.GlobalRateLimit // the agentgateway Gateway's global rate limit
	oracle *oracle
	ctx    context.Context
}

// newWorld renders the example spec after mutate, derives the service config
// and starts the service with its clock at start.
func newWorld(t *testing.T, vk *valkeytest.Server, start time.Time, mutate func(*spec.BudgetSet)) *world {
	t.Helper()
	bs, err := spec.LoadFile(examplePath, nil)
	if err != nil {
		t.Fatal(err)
	}
	mutate(bs)
	res, err := render.Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	var btps []*egv1a1.BackendTrafficPolicy
	var agw *agentgateway.GlobalRateLimit
	for _, o := range res.Objects {
		switch p := agentgateway.Model(o.Object).(type) {
		case *egv1a1.BackendTrafficPolicy:
			btps = append(btps, p)
		case *agentgateway.Policy:
			if p.Spec.Traffic == nil {
				continue // the backend TLS policy on the rate limit Service
			}
			if agw != nil {
				t.Fatal("rendered two AgentgatewayPolicies, want 1")
			}
			agw = p.Spec.Traffic.RateLimit.Global
		}
	}
	if len(btps) != 1 || agw == nil {
		t.Fatalf("rendered %d BackendTrafficPolicies and agentgateway %v, want 1 and one AgentgatewayPolicy", len(btps), agw != nil)
	}
	cfgs, err := rlsconfig.Configs(btps)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := config.FromProto(cfgs); err != nil { // what the service builds from EG's xDS resources
		t.Fatal(err)
	}
	routes, err := rlsconfig.RouteRateLimits(btps[0])
	if err != nil {
		t.Fatal(err)
	}
	// agentgateway's domain: the files render --ratelimit-config writes.
	cfgDir := t.TempDir()
	files, err := rlsconfig.Files(res.AgentgatewayConfigs)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(cfgDir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Every test starts from empty counters.
	if _, err := vk.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	st, err := valkey.New(valkey.Options{Addresses: []string{vk.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	c := &clock{t: start}
	reg := prometheus.NewRegistry()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng, err := engine.New(engine.Options{
		Store: st, Now: c.Now, Observers: []observe.Observer{observe.NewMetrics(metrics.New(reg))}, Logger: quiet,
		// Generous deadline and no silent fail-open: a slow CI machine must
		// not turn a store timeout into an "admitted".
		StoreTimeout: 5 * time.Second, FailurePolicy: decide.FailError,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	// Both sources, as the service runs them: the files and EG's xDS config.
	a := &source.Applier{Sink: eng, Logger: quiet}
	if err := (&source.Files{Dir: config.DirOptions{Root: cfgDir}}).Load(a); err != nil {
		t.Fatal(err)
	}
	if err := a.ApplyProto(context.Background(), cfgs); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(eng, server.Options{GRPCAddr: "127.0.0.1:0", Gatherer: reg, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	served := make(chan struct{})
	go func() { _ = srv.Serve(ctx, time.Second); close(served) }()
	t.Cleanup(func() { cancel(); <-served })
	g, _, _, _ := srv.Addrs()
	conn, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &world{t: t, clock: c, client: rlsv3.NewRateLimitServiceClient(conn), reg: reg, btp: btps[0], routes: routes, agw: agw, oracle: newOracle(btps[0], render.BudgetMap(bs)), ctx: ctx}
}

// llmCall sends one LLM request through "Envoy": the request-time check and,
// when admitted, the stream-done charge of tokens. It returns whether the
// request was admitted, and checks every descriptor decision against the
// oracle (a plain model of fixed-window counters).
func (w *world) llmCall(headers map[string]string, tokens uint64) bool {
	w.t.Helper()
	req := rlsconfig.Request{Headers: headers, Metadata: map[string]string{tokenMeta: strconv.FormatUint(tokens, 10)}}
	calls, err := rlsconfig.Requests(w.routes, req, rlsconfig.PhaseRequest)
	if err != nil {
		w.t.Fatal(err)
	}
	admitted := true
	for _, call := range calls {
		for _, d := range call.Descriptors {
			// Token budgets check with hits_addend 0; only the kill switch
			// (a request-count rule) leaves it unset (1 hit).
			if d.HitsAddend == nil {
				if !w.oracle.killSwitch(d.Entries[0].Value) {
					w.t.Fatalf("request-time descriptor %v without hits_addend", d.Entries)
				}
			} else if d.HitsAddend.Value != 0 {
				w.t.Fatalf("request-time descriptor %v charges %d", d.Entries, d.HitsAddend.Value)
			}
		}
		if !w.send(call) {
			admitted = false
		}
	}
	if !admitted {
		return false // Envoy answers 429; the upstream never runs, nothing is charged
	}
	done, err := rlsconfig.Requests(w.routes, req, rlsconfig.PhaseStreamDone)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, call := range done {
		w.send(call) // Envoy ignores the answer at stream end
	}
	return true
}

// agentCall sends one LLM request through agentgateway, whose JWT carries
// claims: the request-time check (the prompt not tokenized: hits 0) and,
// when admitted, the amend with the response's tokens. No claim a descriptor
// needs: that descriptor is dropped; none left: no call, admitted.
func (w *world) agentCall(claims map[string]string, tokens uint64) bool {
	w.t.Helper()
	cl := map[string]any{}
	for k, v := range claims {
		cl[k] = v
	}
	check, amend, err := agentgateway.Requests(w.agw, agentgateway.LLMRequest{Claims: cl, InputTokens: tokens / 3, OutputTokens: tokens - tokens/3})
	if err != nil {
		w.t.Fatal(err)
	}
	if check == nil {
		return true
	}
	for _, d := range check.Descriptors {
		if d.HitsAddend == nil || d.HitsAddend.Value != 0 {
			w.t.Fatalf("agentgateway request-time descriptor %v charges %v", d.Entries, d.HitsAddend)
		}
	}
	if !w.send(check) {
		return false // agentgateway answers 429
	}
	if amend != nil {
		w.send(amend) // fire and forget in agentgateway
	}
	return true
}

// send makes one ShouldRateLimit call and returns whether it was admitted.
func (w *world) send(call *rlsv3.RateLimitRequest) bool {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	resp, err := w.client.ShouldRateLimit(ctx, call)
	if err != nil {
		w.t.Fatalf("ShouldRateLimit: %v", err)
	}
	anyEnforcedOver := false
	for i, d := range call.Descriptors {
		over, shadow := w.oracle.hit(w.clock.Now(), d.Entries, hits(d.HitsAddend.GetValue(), d.HitsAddend != nil))
		want := rlsv3.RateLimitResponse_OK
		if over && !shadow {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
			anyEnforcedOver = true
		}
		if got := resp.Statuses[i].Code; got != want {
			w.t.Errorf("%s %v: service says %s, oracle says %s", w.clock.Now().Format(time.RFC3339Nano), d.Entries, got, want)
		}
	}
	if (resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT) != anyEnforcedOver {
		w.t.Errorf("overall %s, oracle over=%v", resp.OverallCode, anyEnforcedOver)
	}
	return resp.OverallCode == rlsv3.RateLimitResponse_OK
}

func hits(v uint64, set bool) uint64 {
	if !set {
		return 1
	}
	return v
}

// calls sends n calls through Envoy Gateway spaced a minute apart and
// returns the admitted pattern, e.g. "++-" for admitted, admitted, denied.
func (w *world) calls(n int, headers map[string]string, tokens uint64) string {
	w.t.Helper()
	return w.callsVia(viaEnvoy, n, headers, tokens)
}

// Which gateway a call goes through.
const (
	viaEnvoy        = "envoy"        // attributes are the headers Envoy sees
	viaAgentgateway = "agentgateway" // attributes are the verified JWT's claims
)

func (w *world) callsVia(via string, n int, attrs map[string]string, tokens uint64) string {
	w.t.Helper()
	var b strings.Builder
	for range n {
		w.clock.Add(time.Minute)
		ok := false
		if via == viaAgentgateway {
			ok = w.agentCall(attrs, tokens)
		} else {
			ok = w.llmCall(attrs, tokens)
		}
		if ok {
			b.WriteByte('+')
		} else {
			b.WriteByte('-')
		}
	}
	return b.String()
}

// shadowOverLimit reads ratelimit_decisions_total{outcome="shadow_over_limit"}
// by rule key (ruleKey).
func (w *world) shadowOverLimit() map[string]int {
	w.t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		w.t.Fatal(err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != "ratelimit_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["outcome"] != metrics.OutcomeShadowOverLimit {
				continue
			}
			var key string
			if sub := ruleIndex.FindStringSubmatch(labels["rule"]); sub != nil {
				i, _ := strconv.Atoi(sub[1])
				key = egRule(i)
			} else if sub := agwRule.FindStringSubmatch(labels["rule"]); sub != nil {
				key = agwBudget(sub[1])
			} else {
				w.t.Fatalf("rule label %q names no rule", labels["rule"])
			}
			out[key] += int(m.GetCounter().GetValue())
		}
	}
	return out
}

var (
	// Envoy Gateway's readable rule: rule/<i>.rule-<i>-match-<m>...
	ruleIndex = regexp.MustCompile(`^rule/(\d+)\.`)
	// agentgateway's readable rule: budget=<name>.principal (or .group=<value>).
	agwRule = regexp.MustCompile(`^budget=([^.]+)\.`)
)

// Rule keys of the oracle and the metrics: Envoy Gateway's rule index, or
// the agentgateway budget.
func egRule(i int) string          { return "envoy/rule/" + strconv.Itoa(i) }
func agwBudget(name string) string { return "agentgateway/" + name }

// agwLimit is an agentgateway budget's cap and mode (from the budget map).
type agwLimit struct {
	cap    uint64
	shadow bool
}

// oracle models the counters: one per (day, descriptor entries); a decision
// is over the limit when the counter after adding the hits exceeds the rule's
// requests per day (envoyproxy/ratelimit's rule). Envoy Gateway's limits come
// from the rendered policy's rules, agentgateway's from the budget map.
type oracle struct {
	rules    []egv1a1.RateLimitRule
	agw      map[string]agwLimit
	counters map[string]uint64
	// shadowOver counts would-be denials by rule key.
	shadowOver map[string]int
}

func newOracle(p *egv1a1.BackendTrafficPolicy, bm *budgetmap.Map) *oracle {
	o := &oracle{rules: p.Spec.RateLimit.Global.Rules, agw: map[string]agwLimit{}, counters: map[string]uint64{}, shadowOver: map[string]int{}}
	for _, e := range bm.Entries {
		if e.Gateway.Kind == budgetmap.GatewayAgentgateway && e.OverridePrincipal == "" {
			o.agw[e.Budget] = agwLimit{cap: uint64(e.TokensPerDay), shadow: e.Mode == budgetmap.ModeShadow}
		}
	}
	return o
}

func (o *oracle) index(ruleName string) int {
	i, err := strconv.Atoi(ruleName[strings.LastIndex(ruleName, "/")+1:])
	if err != nil || i >= len(o.rules) {
		panic("bad rule name " + ruleName)
	}
	return i
}

func (o *oracle) killSwitch(ruleName string) bool {
	r := o.rules[o.index(ruleName)]
	return r.Cost == nil && r.Limit.Requests == 0
}

func (o *oracle) hit(now time.Time, entries []*rlcommonv3.RateLimitDescriptor_Entry, n uint64) (over, shadow bool) {
	var key string
	var limit uint64
	if entries[0].Key == "budget" { // agentgateway: {budget: <name>}, then the principal
		l, ok := o.agw[entries[0].Value]
		if !ok {
			panic("unknown agentgateway budget " + entries[0].Value)
		}
		key, limit, shadow = agwBudget(entries[0].Value), l.cap, l.shadow
	} else {
		i := o.index(entries[0].Value)
		r := o.rules[i]
		key, limit, shadow = egRule(i), uint64(r.Limit.Requests), r.ShadowMode != nil && *r.ShadowMode
	}
	var k strings.Builder
	k.WriteString(strconv.FormatInt(now.Unix()/86400, 10))
	for _, e := range entries {
		k.WriteString("\x00" + e.Key + "\x00" + e.Value)
	}
	o.counters[k.String()] += n
	over = o.counters[k.String()] > limit
	if over && shadow {
		o.shadowOver[key]++
	}
	return over, shadow
}
