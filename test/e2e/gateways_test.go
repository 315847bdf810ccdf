package e2e

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	valkeygo "github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/engine"
	"github.com/budgetgen/budgetgen/internal/ratelimit/observe"
	"github.com/budgetgen/budgetgen/internal/ratelimit/source"
	"github.com/budgetgen/budgetgen/internal/rlsconfig"
	"github.com/budgetgen/budgetgen/internal/store/valkey"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// gatewaysSpec has one budget on two Envoy Gateway Gateways and one
// agentgateway Gateway, all keyed on the verified JWT's sub claim.
const gatewaysSpec = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: s}
spec:
  gateways:
    - {namespace: edge, name: gw1}
    - {namespace: edge, name: gw2}
    - {namespace: agents, name: agw, kind: agentgateway}
  identities:
    x-user: {jwtClaim: sub}
    x-kind: {jwtClaim: kind}
  budgets:
    - {name: per-user, perPrincipal: x-user, tokensPerDay: 1000, mode: enforce, overrides: [{principal: vip, tokensPerDay: 3000}]}
    - {name: fleet, group: {header: x-kind, equals: agent}, tokensPerDay: 5000, mode: enforce}
`

// mesh is one rendered spec served by one engine over one Valkey: Envoy
// Gateway's domains arrive as xDS resources, agentgateway's from the files
// render wrote, and, when asked, the budget map render wrote.
type mesh struct {
	t      *testing.T
	clock  *clock
	eng    *engine.Engine
	routes map[string]map[string][]*routev3.RateLimit // gateway name -> EG route rate limits
	agw    map[string]*agentgateway.GlobalRateLimit
	ledger *ledger.Valkey
	vk     valkeygo.Client
}

func newMesh(t *testing.T, vk *valkeytest.Server, doc string, withMap bool) *mesh {
	t.Helper()
	bs, err := spec.Load([]byte(doc), "s.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := render.Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	m := &mesh{t: t, clock: &clock{t: testDay()}, routes: map[string]map[string][]*routev3.RateLimit{}, agw: map[string]*agentgateway.GlobalRateLimit{}}
	var btps []*egv1a1.BackendTrafficPolicy
	for _, o := range res.Objects {
		switch p := agentgateway.Model(o.Object).(type) {
		case *egv1a1.BackendTrafficPolicy:
			btps = append(btps, p)
			r, err := rlsconfig.RouteRateLimits(p)
			if err != nil {
				t.Fatal(err)
			}
			m.routes[string(p.Spec.TargetRefs[0].Name)] = r
		case *agentgateway.Policy:
			if p.Spec.Traffic == nil {
				continue // the backend TLS policy on the rate limit Service
			}
			m.agw[p.Spec.TargetRefs[0].Name] = p.Spec.Traffic.RateLimit.Global
		}
	}
	egCfgs, err := rlsconfig.Configs(btps)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files, err := rlsconfig.Files(res.AgentgatewayConfigs)
	if err != nil {
		t.Fatal(err)
	}
	cfgDir := filepath.Join(dir, "config")
	if err := os.Mkdir(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(cfgDir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := vk.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	st, err := valkey.New(valkey.Options{Addresses: []string{vk.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m.vk, err = valkeygo.NewClient(valkeygo.ClientOption{InitAddress: []string{vk.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.vk.Close)
	m.ledger = ledger.NewValkey(m.vk, "")
	rec, err := ledger.NewRecorder(ledger.Options{}, ledger.NewValkeySink(m.vk), m.clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	m.eng, err = engine.New(engine.Options{
		Store: st, Now: m.clock.Now, Logger: quiet, Observers: []observe.Observer{&observe.Ledger{Recorder: rec}},
		StoreTimeout: 5 * time.Second, FailurePolicy: decide.FailError,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.eng.Close() })
	a := &source.Applier{Sink: m.eng, Logger: quiet}
	if withMap {
		data, err := budgetmap.Encode(render.BudgetMap(bs))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "budget-map.yaml")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := (&source.BudgetMapFile{Path: path}).Load(a); err != nil {
			t.Fatal(err)
		}
	}
	if err := (&source.Files{Dir: config.DirOptions{Root: cfgDir}}).Load(a); err != nil {
		t.Fatal(err)
	}
	if err := a.ApplyProto(context.Background(), egCfgs); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *mesh) send(req *rlsv3.RateLimitRequest) bool {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := m.eng.ShouldRateLimit(ctx, req)
	if err != nil {
		m.t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp.OverallCode == rlsv3.RateLimitResponse_OK
}

// egCall is one LLM request through an Envoy Gateway Gateway: a check, then
// (admitted) the stream-done charge, exactly as Envoy builds them.
func (m *mesh) egCall(gw string, claims map[string]string, tokens uint64) bool {
	m.t.Helper()
	h := map[string]string{}
	if v, ok := claims["sub"]; ok {
		h["x-user"] = v
	}
	if v, ok := claims["kind"]; ok {
		h["x-kind"] = v
	}
	req := rlsconfig.Request{Headers: h, Metadata: map[string]string{tokenMeta: strconv.FormatUint(tokens, 10)}}
	calls, err := rlsconfig.Requests(m.routes[gw], req, rlsconfig.PhaseRequest)
	if err != nil {
		m.t.Fatal(err)
	}
	ok := true
	for _, c := range calls {
		ok = m.send(c) && ok
	}
	if !ok {
		return false
	}
	done, err := rlsconfig.Requests(m.routes[gw], req, rlsconfig.PhaseStreamDone)
	if err != nil {
		m.t.Fatal(err)
	}
	for _, c := range done {
		m.send(c)
	}
	return true
}

// agwCall is one LLM request through agentgateway: the request-time check
// (input tokens not estimated: hits 0) and the amend with the total.
func (m *mesh) agwCall(gw string, claims map[string]string, tokens uint64) bool {
	m.t.Helper()
	cl := map[string]any{}
	for k, v := range claims {
		cl[k] = v
	}
	check, amend, err := agentgateway.Requests(m.agw[gw], agentgateway.LLMRequest{Claims: cl, InputTokens: tokens / 2, OutputTokens: tokens - tokens/2})
	if err != nil {
		m.t.Fatal(err)
	}
	if check == nil {
		return true // nothing to limit: agentgateway makes no call
	}
	if !m.send(check) {
		return false
	}
	if amend != nil {
		m.send(amend) // fire and forget in agentgateway
	}
	return true
}

type hop struct {
	gw     string // gateway name; "agw" is the agentgateway one
	tokens uint64
}

func (m *mesh) walk(claims map[string]string, hops ...hop) string {
	m.t.Helper()
	var b strings.Builder
	for _, h := range hops {
		m.clock.Add(time.Minute)
		var ok bool
		if _, isAgw := m.agw[h.gw]; isAgw {
			ok = m.agwCall(h.gw, claims, h.tokens)
		} else {
			ok = m.egCall(h.gw, claims, h.tokens)
		}
		if ok {
			b.WriteByte('+')
		} else {
			b.WriteByte('-')
		}
	}
	return b.String()
}

// usage reads the ledger: rule -> principal -> tokens of the test day.
func (m *mesh) usage() map[string]map[string]uint64 {
	m.t.Helper()
	ctx := context.Background()
	days := []ledger.Window{ledger.DayWindow(ledger.DayOf(testDay()))}
	keys, err := m.ledger.Keys(ctx, days)
	if err != nil {
		m.t.Fatal(err)
	}
	out := map[string]map[string]uint64{}
	for _, k := range keys {
		r := k.Rule
		d, err := m.ledger.Read(ctx, r, days[0])
		if err != nil {
			m.t.Fatal(err)
		}
		out[r.String()] = d.Usage
	}
	return out
}

func budgetKeys(t *testing.T, vk *valkeytest.Server) int {
	t.Helper()
	out, err := vk.Do("KEYS", "bgb1|*")
	if err != nil {
		t.Fatal(err)
	}
	return len(strings.Fields(out))
}

// One principal through two Envoy Gateway Gateways and an agentgateway
// Gateway fills ONE budget with the budget map; without it each Gateway gives
// the cap again (the bug of issue 11).
func TestOnePrincipalOneBudgetAcrossGateways(t *testing.T) {
	vk := startValkey(t)
	u1 := map[string]string{"sub": "u1"}
	route := []hop{{"gw1", 600}, {"gw2", 600}, {"agw", 100}, {"gw1", 100}}

	m := newMesh(t, vk, gatewaysSpec, true)
	if got := m.walk(u1, route...); got != "++--" {
		t.Errorf("with the budget map: %s, want ++-- (600 + 600 over the 1000 cap, then denied everywhere)", got)
	}
	if got := m.walk(map[string]string{"sub": "u2"}, hop{"agw", 900}, hop{"gw2", 50}); got != "++" {
		t.Errorf("another principal: %s, want ++", got)
	}
	if got := m.walk(map[string]string{"sub": "vip"}, hop{"gw1", 1500}, hop{"agw", 1600}, hop{"gw2", 10}, hop{"agw", 10}); got != "++--" {
		t.Errorf("override principal (3000 cap): %s, want ++--", got)
	}
	if n := budgetKeys(t, vk); n != 3 {
		t.Errorf("%d budget counters in Valkey, want 3 (u1, u2, vip)", n)
	}
	// The ledger names the budget once, with the principal's total over all Gateways.
	u := m.usage()
	if got := u["budget s/per-user"]; got["u1"] != 1200 || got["u2"] != 950 || got["vip"] != 3100 {
		t.Errorf("ledger of bucket s/per-user = %v (all rows %v)", got, u)
	}
	for r := range u {
		if !strings.HasPrefix(r, "budget ") {
			t.Errorf("ledger row %q is per Gateway rule, want per bucket only", r)
		}
	}

	legacy := newMesh(t, vk, gatewaysSpec, false)
	if got := legacy.walk(u1, route...); got != "++++" {
		t.Errorf("without a budget map: %s, want ++++ (each Gateway counts alone, reference-compatible keys)", got)
	}
	if n := budgetKeys(t, vk); n != 0 {
		t.Errorf("%d budget counters without a map, want 0", n)
	}
}

// bucket: perGateway gives each Gateway its own counter, still shared by
// the routes of one Gateway.
func TestPerGatewayBucketsCountApart(t *testing.T) {
	vk := startValkey(t)
	doc := strings.Replace(gatewaysSpec, "mode: enforce, overrides", "mode: enforce, bucket: perGateway, overrides", 1)
	m := newMesh(t, vk, doc, true)
	got := m.walk(map[string]string{"sub": "u1"}, hop{"gw1", 600}, hop{"gw2", 600}, hop{"gw1", 600}, hop{"gw1", 10}, hop{"gw2", 10}, hop{"agw", 10})
	if got != "+++-++" {
		t.Errorf("perGateway: %s, want +++-++ (gw1 fills at 1200, gw2 and agw have their own)", got)
	}
	u := m.usage()
	if u["budget s/per-user@edge/gw1"]["u1"] != 1200 || u["budget s/per-user@edge/gw2"]["u1"] != 610 || u["budget s/per-user@agents/agw"]["u1"] != 10 {
		t.Errorf("ledger = %v", u)
	}
}

// A day through both request shapes against one service: the group budget is
// one bucket across Envoy Gateway and agentgateway, and so is per-user's
// bucket for requests without the claim (agentgateway's coalesce, Envoy
// Gateway's unidentified requests' rule: principal budgetgen/no-claim).
func TestDayThroughBothRequestShapes(t *testing.T) {
	vk := startValkey(t)
	m := newMesh(t, vk, gatewaysSpec, true)
	agent := func(sub string) map[string]string { return map[string]string{"sub": sub, "kind": "agent"} }
	steps := []struct {
		who    map[string]string
		hops   []hop
		expect string
	}{
		// Fleet (5000 shared) and per-user (1000) both apply to agents.
		{agent("a1"), []hop{{"agw", 900}, {"gw1", 200}, {"agw", 10}}, "++-"},
		{agent("a2"), []hop{{"gw2", 900}, {"agw", 900}}, "++"},
		{agent("a3"), []hop{{"agw", 900}, {"gw1", 900}}, "++"},
		// Fleet at 1100 + 1800 + 1800 = 4700: one more admitted, then the fleet is full.
		{agent("a4"), []hop{{"gw2", 500}, {"agw", 10}}, "+-"},
		{agent("a5"), []hop{{"gw1", 1}}, "-"},
		// A human (no kind claim) only meets per-user.
		{map[string]string{"sub": "h1"}, []hop{{"agw", 999}, {"gw2", 2}, {"gw1", 1}}, "++-"},
		// No claim: charged to per-user's one no-claim bucket (cap 1000) on
		// either Gateway, so agentgateway's 100000 makes gw1 deny.
		{map[string]string{}, []hop{{"agw", 100000}, {"gw1", 100000}}, "+-"},
	}
	for _, s := range steps {
		if got := m.walk(s.who, s.hops...); got != s.expect {
			t.Errorf("%v: %s, want %s", s.who, got, s.expect)
		}
	}
	u := m.usage()
	if got := u["budget s/fleet"][""]; got != 5200 {
		t.Errorf("fleet bucket = %d tokens, want 5200 (%v)", got, u)
	}
	// Past midnight UTC every bucket starts again, through both shapes.
	m.clock.Set(testDay().Add(24 * time.Hour))
	if got := m.walk(agent("a1"), hop{"agw", 10}, hop{"gw1", 10}); got != "++" {
		t.Errorf("next day: %s, want ++", got)
	}
}

// windowsSpec puts a budget with a daily and a monthly cap on an Envoy
// Gateway Gateway and an agentgateway Gateway; its override has a daily cap
// only, which replaces both of the default's (as on Envoy Gateway).
const windowsSpec = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: s}
spec:
  gateways:
    - {namespace: edge, name: gw1}
    - {namespace: agents, name: agw, kind: agentgateway}
  identities:
    x-user: {jwtClaim: sub}
  budgets:
    - name: per-user
      perPrincipal: x-user
      limits: [{tokens: 1000, per: day}, {tokens: 2500, per: month}]
      mode: enforce
      overrides: [{principal: vip, limits: [{tokens: 3000, per: day}]}]
`

// Both windows of one budget bind through both request shapes in one
// bucket per window: the day cap within a day, the month cap across days
// (calendar month, UTC), and the override's principal meets its own daily
// cap and no monthly one.
func TestDailyAndMonthlyCapsThroughBothShapes(t *testing.T) {
	vk := startValkey(t)
	m := newMesh(t, vk, windowsSpec, true)
	// The 1st of next month, 08:00 UTC: three days inside one calendar
	// month whatever today is, and all after Valkey's own clock (the
	// counters' absolute expiries lie ahead of it).
	now := time.Now().UTC()
	first := time.Date(now.Year(), now.Month()+1, 1, 8, 0, 0, 0, time.UTC)
	alice, vip := map[string]string{"sub": "alice"}, map[string]string{"sub": "vip"}
	for _, d := range []struct {
		day          int
		alice, vip   []hop
		wantA, wantV string
	}{
		// Day cap: 900 + 200 admitted (the check comes before the charge),
		// then denied everywhere. Month: 1100.
		{0, []hop{{"agw", 900}, {"gw1", 200}, {"agw", 10}, {"gw1", 10}}, []hop{{"agw", 2900}, {"gw1", 200}, {"agw", 1}}, "++--", "++-"},
		// A new day: 900 + 600 admitted by the day cap; the month (1100 +
		// 1500 = 2600) is now over 2500. The override: 3100 again.
		{1, []hop{{"gw1", 900}, {"agw", 600}, {"agw", 1}}, []hop{{"gw1", 3000}, {"agw", 100}, {"gw1", 1}}, "++-", "++-"},
		// Day three: the day counter is empty, the month cap still denies
		// alice on both Gateways; vip has no monthly cap (6200 so far).
		{2, []hop{{"agw", 1}, {"gw1", 1}}, []hop{{"agw", 100}, {"gw1", 100}}, "--", "++"},
	} {
		m.clock.Set(first.AddDate(0, 0, d.day))
		if got := m.walk(alice, d.alice...); got != d.wantA {
			t.Errorf("day %d, alice: %s, want %s", d.day+1, got, d.wantA)
		}
		if got := m.walk(vip, d.vip...); got != d.wantV {
			t.Errorf("day %d, vip: %s, want %s", d.day+1, got, d.wantV)
		}
	}
	// One counter per (principal, window) across both Gateways: alice's
	// first two days and her month (denied on day three, she was charged
	// nothing, so that day has no counter), vip's three days and no month.
	if n := budgetKeys(t, vk); n != 6 {
		out, _ := vk.Do("KEYS", "bgb1|*")
		t.Errorf("%d budget counters, want 6 (alice: 2 days + 1 month, vip: 3 days):\n%s", n, out)
	}
}
