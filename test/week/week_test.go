// Package week runs the simulated week: a spec in shadow, Envoy Gateway's rate limit
// traffic for seven full UTC days from several principal profiles (steady,
// bursty, a runaway agent, an override client, teams under hour, week, month
// and money caps) through the real decision
// engine and the Valkey store (with the spec's budget map, as the service
// runs it), then the report checked against numbers the test computes itself
// from what it sent, then promotion refused on day 6 and accepted on day 8
// with the report as evidence. A reserving budget's agents fan out and lose a
// charge (reserve_test.go).
package week

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	vk "github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/cli"
	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/promote"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/engine"
	"github.com/budgetgen/budgetgen/internal/ratelimit/observe"
	"github.com/budgetgen/budgetgen/internal/ratelimit/source"
	"github.com/budgetgen/budgetgen/internal/report"
	"github.com/budgetgen/budgetgen/internal/rlsconfig"
	"github.com/budgetgen/budgetgen/internal/store/valkey"
	"github.com/budgetgen/budgetgen/internal/thresholds"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

const weekSpec = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: week}
spec:
  gateways: [{namespace: gw, name: router}]
  identities:
    x-ar-run: {jwtClaim: run_id}                # agent runs
    x-api-key-client: {apiKeyClientID: true}    # API-key clients
    x-team: {extAuth: true}                     # teams, charged in money too
    x-agent: {jwtClaim: agent_id}               # agents that fan out
  pricing:
    currency: EUR
    models: [{model: "m", input: 1, output: 2}]
    default: {input: 15, output: 75}

  budgets:
    # A runaway agent is expected to show up here.
    - {name: per-run, perPrincipal: x-ar-run, tokensPerDay: 100000, mode: shadow, shadowSince: DAY0}
    - {name: per-api-key, perPrincipal: x-api-key-client, tokensPerDay: 50000, mode: shadow, shadowSince: DAY0, overrides: [{principal: big-batch, tokensPerDay: 500000}]}
    # Every window but the day, and money: each cap judged on its own window.
    - {name: per-team, perPrincipal: x-team, mode: shadow, shadowSince: DAY0, limits: [{tokens: 3000, per: hour}, {tokens: 20000, per: week}, {tokens: 40000, per: month}, {cost: 1, per: month}]}
    # Reserves: each admitted, unfinished call holds 20,000 tokens.
    - {name: per-agent, perPrincipal: x-agent, tokensPerDay: 60000, reserve: 20000, mode: shadow, shadowSince: DAY0}
`

type simClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *simClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *simClock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// request is one LLM call of a principal: its header, its token count and,
// for a team, its cost in 1/10,000 EUR. phase is both (the request-path check
// then the stream-done charge), or one of them alone: a fan-out sends its
// checks before its charges, a lost call's charge never comes.
type request struct {
	header, principal string
	budget            string
	tokens, cost      uint64
	phase             callPhase
	// together: sent at the same instant as the request before it (the
	// calls of a fan-out).
	together bool
}

type callPhase int

const (
	bothPhases callPhase = iota
	checkOnly
	chargeOnly
)

// day k (1..7) traffic, in sending order.
func traffic(k int) []request {
	var out []request
	add := func(header, budget, p string, n int, tok, cost uint64) {
		for i := 0; i < n; i++ {
			out = append(out, request{header, p, budget, tok, cost, bothPhases, false})
		}
	}
	if k == 4 { // team-b's burst first thing: 4,000 tokens in one hour, over its 3,000 hour cap
		add("x-team", "per-team", "team-b", 4, 1000, 300)
	}
	out = append(out, agentsFirst(k)...)
	// Teams, spread over the day: 4,500 and 2,000 tokens a day (31,500 a
	// week: over the 20,000 week cap), EUR 0.12 and 0.06 a day.
	add("x-team", "per-team", "team-a", 1, 1500, 400)
	for i := 0; i < 10; i++ { // steady runs: 5 calls a day, 40k-44.5k of 100k
		add("x-ar-run", "per-run", fmt.Sprintf("run-s%02d", i), 5, uint64(8000+100*i), 0)
	}
	if k >= 3 { // the runaway agent: 40 calls of 5k from day 3 (200k of 100k)
		add("x-ar-run", "per-run", "run-agent", 40, 5000, 0)
	} else {
		add("x-ar-run", "per-run", "run-agent", 2, 5000, 0)
	}
	add("x-team", "per-team", "team-a", 1, 1500, 400)
	add("x-team", "per-team", "team-b", 1, 1000, 300)
	for i := 0; i < 15; i++ { // steady API clients: 12k-14.8k of 50k
		add("x-api-key-client", "per-api-key", fmt.Sprintf("key-s%02d", i), 4, uint64(3000+50*i), 0)
	}
	for i := 0; i < 4; i++ { // bursty clients: 4k a day, 47k (94%) on their burst day
		if k == 2+i {
			add("x-api-key-client", "per-api-key", fmt.Sprintf("key-b%d", i), 10, 4700, 0)
		} else {
			add("x-api-key-client", "per-api-key", fmt.Sprintf("key-b%d", i), 2, 2000, 0)
		}
	}
	// The override client: 300k of its own 500k cap, 600k on day 7.
	if k == 7 {
		add("x-api-key-client", "per-api-key", "big-batch", 6, 100000, 0)
	} else {
		add("x-api-key-client", "per-api-key", "big-batch", 3, 100000, 0)
	}
	add("x-team", "per-team", "team-a", 1, 1500, 400)
	add("x-team", "per-team", "team-b", 1, 1000, 300)
	return append(out, agentsLast(k)...)
}

// expected holds what the test computes itself from what it sent.
type expected struct {
	usage    map[string]map[string]map[int]uint64 // budget -> principal -> day -> tokens
	would429 map[string]uint64                    // budget -> request-path checks over the cap
	crossing map[string]int                       // threshold percent -> count
	// windows: the team caps' usage per measure ("hour", "week", "month",
	// "cost"), principal and ledger window; teamWould429 their would-be 429s
	// per measure and window.
	windows      map[string]map[string]map[ledger.Window]uint64
	teamWould429 map[string]map[ledger.Window]uint64
	// res models the reserving budget's holds.
	res *reserveModel
}

func capOf(budget, principal string) uint64 {
	switch {
	case budget == "per-run":
		return 100000
	case budget == "per-agent":
		return agentCap
	case principal == "big-batch":
		return 500000
	}
	return 50000
}

// teamCaps are per-team's caps by measure (the money cap in 1/10,000 EUR).
var teamCaps = map[string]uint64{"hour": 3000, "week": 20000, "month": 40000, "cost": 10000}

// week is the simulated world: the rendered spec, the engine on Valkey,
// the ledger and the threshold detector, on a simulated clock.
type week struct {
	t           *testing.T
	ctx         context.Context
	srv         *valkeytest.Server
	day0        ledger.Day
	dir         string
	specFile    string
	bs          *spec.BudgetSet
	routeLimits map[string][]*routev3.RateLimit
	clock       *simClock
	lv          *ledger.Valkey
	rec         *ledger.Recorder
	det         *thresholds.Detector
	eng         *engine.Engine
	logs        bytes.Buffer
	logMu       sync.Mutex
}

func (w *week) dayStart(k int) time.Time { return (w.day0 + ledger.Day(k)).Start() }

func TestSimulatedWeek(t *testing.T) {
	w := newWeek(t)
	// One round trip per charge, one charge script: ten charges of fresh
	// principals (below the cap, so none is answered from the local cache)
	// cost ten scripts, each a SETBIT of its call id, an INCRBY and a
	// HINCRBY (the ledger) per counter and, as each is its counter's first,
	// a PEXPIREAT NX; ten more charges of the same principals cost the same
	// without the PEXPIREAT, nothing else. A team's charge touches its four
	// counters (hour, week, month, money): four of each.
	probes := w.checkCommandsPerCharge("x-ar-run", 1, w.dayStart(0).Add(10*time.Hour))
	probes = append(probes, w.checkCommandsPerCharge("x-team", 4, w.dayStart(0).Add(11*time.Hour))...)

	exp := w.send(probes)
	w.checkThresholds(exp)
	rep := w.report()
	for _, b := range rep.Budgets {
		checkReservations(t, b, exp)
		if b.Name == "per-team" {
			checkTeam(t, b, exp, w.dayStart(1), w.dayStart(8))
			continue
		}
		checkBudget(t, b, exp)
	}
	checkReservationText(t, rep)
	w.checkPromotion(rep)
}

// newWeek renders the spec and starts the engine on a real Valkey.
func newWeek(t *testing.T) *week {
	w := &week{t: t, ctx: context.Background(), srv: valkeytest.Start(t, valkeytest.Options{})}
	// Valkey expires keys on its own clock, so the simulated week lies in
	// its future: shadowing starts tomorrow (day 0).
	w.day0 = ledger.DayOf(time.Now()) + 1
	w.dir = t.TempDir()
	w.specFile = filepath.Join(w.dir, "budgets.yaml")
	if err := os.WriteFile(w.specFile, []byte(strings.ReplaceAll(weekSpec, "DAY0", w.day0.String())), 0o644); err != nil {
		t.Fatal(err)
	}
	var err error
	if w.bs, err = spec.LoadFile(w.specFile, nil); err != nil {
		t.Fatal(err)
	}
	res, err := render.Render(w.bs)
	if err != nil {
		t.Fatal(err)
	}
	var btps []*egv1a1.BackendTrafficPolicy
	for _, o := range res.Objects {
		if b, ok := o.Object.(*egv1a1.BackendTrafficPolicy); ok {
			btps = append(btps, b)
		}
	}
	protos, err := rlsconfig.Configs(btps)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.FromProto(protos)
	if err != nil {
		t.Fatal(err)
	}
	// The budget map, as the service loads it: budgets are counted in their
	// buckets, and per-agent's rule reserves.
	if cfg, err = config.Merge(source.ScopeFromMap(render.BudgetMap(w.bs)), cfg); err != nil {
		t.Fatal(err)
	}
	if w.routeLimits, err = rlsconfig.RouteRateLimits(btps[0]); err != nil {
		t.Fatal(err)
	}
	w.startEngine(cfg)
	return w
}

// startEngine wires the store, the ledger and the thresholds as the service does.
func (w *week) startEngine(cfg *config.Config) {
	t := w.t
	w.clock = &simClock{t: w.dayStart(1)}
	st, err := valkey.New(valkey.Options{Addresses: []string{w.srv.Addr}, Now: w.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	vc, err := vk.NewClient(vk.ClientOption{InitAddress: []string{w.srv.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vc.Close)
	w.lv = ledger.NewValkey(vc, "")
	if w.rec, err = ledger.NewRecorder(ledger.Options{}, w.lv, w.clock.Now); err != nil {
		t.Fatal(err)
	}
	lw := &lockedWriter{w: &w.logs, mu: &w.logMu}
	if w.det, err = thresholds.New(thresholds.Options{Logger: slog.New(slog.NewJSONHandler(lw, nil)), Registerer: prometheus.NewRegistry()}); err != nil {
		t.Fatal(err)
	}
	if w.eng, err = engine.New(engine.Options{Store: st, Now: w.clock.Now, Observers: []observe.Observer{&observe.Ledger{Recorder: w.rec, Thresholds: w.det}}, StoreTimeout: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.eng.Close() })
	w.eng.SetConfig(cfg)
}

// send runs the week's traffic through the engine, each call a request-path
// check then a response-path charge, and counts what it sent.
func (w *week) send(probes []sent) expected {
	t := w.t
	exp := expected{usage: map[string]map[string]map[int]uint64{}, would429: map[string]uint64{}, crossing: map[string]int{}, windows: map[string]map[string]map[ledger.Window]uint64{}, teamWould429: map[string]map[ledger.Window]uint64{}, res: newReserveModel()}
	for _, p := range probes {
		exp.add(p.r, 0, p.at)
	}
	calls := 0
	deadline := time.Now().Add(2 * time.Minute)
	for k := 1; k <= 7; k++ {
		reqs := traffic(k)
		step := 20 * time.Hour / time.Duration(len(reqs))
		var at time.Time
		for i, r := range reqs {
			if time.Now().After(deadline) {
				t.Fatal("simulated week took more than 2 minutes")
			}
			if !r.together {
				at = w.dayStart(k).Add(time.Hour + time.Duration(i)*step)
			}
			w.clock.Set(at)
			switch {
			case r.budget == "per-agent":
				exp.would429[r.budget] += exp.res.call(r, k, at, exp.usage[r.budget][r.principal][k])
			case r.budget != "per-team" && exp.usage[r.budget][r.principal][k] > capOf(r.budget, r.principal):
				exp.would429[r.budget]++ // the request-path check of a principal already over
			}
			calls += w.call(r)
			exp.add(r, k, at)
		}
		// End of the day: deferred over-limit charges and the ledger's batch.
		w.eng.Flush()
		if err := w.rec.Flush(w.ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d ShouldRateLimit calls over 7 simulated days", calls)
	return exp
}

// call sends one LLM call's phases (both, or the one it has); shadow mode
// answers OK either way.
func (w *week) call(r request) int {
	hreq := rlsconfig.Request{Headers: map[string]string{r.header: r.principal, ":method": "POST", ":path": "/v1/chat/completions"},
		Metadata: map[string]string{"io.envoy.ai_gateway:llm_total_token": fmt.Sprint(r.tokens), "io.envoy.ai_gateway:budgetgen_cost": fmt.Sprint(r.cost)}}
	n := 0
	for i, phase := range []rlsconfig.Phase{rlsconfig.PhaseRequest, rlsconfig.PhaseStreamDone} {
		if r.phase == checkOnly && i == 1 || r.phase == chargeOnly && i == 0 {
			continue
		}
		calls, err := rlsconfig.Requests(w.routeLimits, hreq, phase)
		if err != nil || len(calls) != 1 {
			w.t.Fatalf("descriptors for %+v: %v %d", r, err, len(calls))
		}
		resp, err := w.eng.ShouldRateLimit(w.ctx, calls[0])
		if err != nil {
			w.t.Fatal(err)
		}
		if resp.OverallCode != rlpb.RateLimitResponse_OK {
			w.t.Fatalf("shadow mode answered %v", resp.OverallCode)
		}
		n++
	}
	return n
}

// add counts a sent call: day usage of the day-cap budgets, window usage of
// the team caps.
func (exp *expected) add(r request, k int, at time.Time) {
	if r.phase == checkOnly {
		return // a check adds nothing
	}
	if r.budget != "per-team" {
		if k == 0 {
			return // before the report's days
		}
		if exp.usage[r.budget] == nil {
			exp.usage[r.budget] = map[string]map[int]uint64{}
		}
		if exp.usage[r.budget][r.principal] == nil {
			exp.usage[r.budget][r.principal] = map[int]uint64{}
		}
		exp.usage[r.budget][r.principal][k] += r.tokens
		return
	}
	for m, p := range map[string]ledger.Period{"hour": ledger.PeriodHour, "week": ledger.PeriodWeek, "month": ledger.PeriodMonth, "cost": ledger.PeriodMonth} {
		if exp.windows[m] == nil {
			exp.windows[m] = map[string]map[ledger.Window]uint64{}
		}
		if exp.windows[m][r.principal] == nil {
			exp.windows[m][r.principal] = map[ledger.Window]uint64{}
		}
		if exp.teamWould429[m] == nil {
			exp.teamWould429[m] = map[ledger.Window]uint64{}
		}
		win := ledger.WindowAt(p, at, nil)
		if exp.windows[m][r.principal][win] > teamCaps[m] {
			exp.teamWould429[m][win]++ // the request-path check of a team already over
		}
		v := r.tokens
		if m == "cost" {
			v = r.cost
		}
		exp.windows[m][r.principal][win] += v
	}
}

// checkThresholds: each 80/90/100% of every cap is crossed once per
// principal and window, day, hour, week, month and money alike.
func (w *week) checkThresholds(exp expected) {
	t := w.t
	for b, ps := range exp.usage {
		for p, days := range ps {
			for _, used := range days {
				exp.cross(used, capOf(b, p))
			}
		}
	}
	for m, ps := range exp.windows {
		for _, ws := range ps {
			for _, used := range ws {
				exp.cross(used, teamCaps[m])
			}
		}
	}
	w.logMu.Lock()
	events := strings.Count(w.logs.String(), `"event":"budget_threshold"`)
	w.logMu.Unlock()
	got := map[string]int{}
	mfs, err := prometheus.Gatherers{w.registry()}.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "threshold" {
					got[l.GetValue()] += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	total := 0
	for pct, n := range exp.crossing {
		total += n
		if got[pct] != n {
			t.Errorf("threshold %s%%: counters %d, want %d", pct, got[pct], n)
		}
	}
	if events != total {
		t.Errorf("threshold events %d, expected %d", events, total)
	}
}

// cross counts the thresholds a window's total crossed.
func (exp *expected) cross(used, capv uint64) {
	for _, pct := range []int{80, 90, 100} {
		if used >= thresholds.Threshold(capv, pct) {
			exp.crossing[fmt.Sprint(pct)]++
		}
	}
}

func (w *week) registry() prometheus.Gatherer {
	reg := prometheus.NewRegistry()
	reg.MustRegister(w.det.Collector())
	return reg
}

// report builds the report as budgetgen report would, on day 8.
func (w *week) report() *report.Report {
	t := w.t
	w.clock.Set(w.dayStart(8).Add(8 * time.Hour))
	mapping, err := report.MappingFromSpec(w.bs)
	if err != nil {
		t.Fatal(err)
	}
	ropts := report.Options{Now: w.clock.Now(), Days: 7}
	windows, err := report.ReadWindows(ropts)
	if err != nil {
		t.Fatal(err)
	}
	data, err := ledger.ReadAll(w.ctx, w.lv, windows)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := report.Build(data, mapping, ropts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.From != w.dayStart(1).Format("2006-01-02") || rep.To != w.dayStart(7).Format("2006-01-02") || len(rep.Warnings) != 0 {
		t.Fatalf("window %s..%s warnings %q", rep.From, rep.To, rep.Warnings)
	}
	return rep
}

// checkTeam: each team cap is judged on its own window; its numbers are
// what the test sent into the judged windows (scaled when projected).
func checkTeam(t *testing.T, b report.Budget, exp expected, from, to time.Time) {
	t.Helper()
	if len(b.Caps) != 4 {
		t.Fatalf("per-team caps %+v, want hour, week, month and money", b.Caps)
	}
	for _, c := range b.Caps {
		m := c.Window
		if c.Measure == report.MeasureCost {
			m = "cost"
		}
		if c.Cap != teamCaps[m] {
			t.Errorf("%s cap %d, want %d", m, c.Cap, teamCaps[m])
		}
		judged := map[string]bool{}
		for _, n := range c.Judged.Windows {
			judged[n] = true
		}
		factor := projectionFactor(t, c)
		if m == "hour" && (c.Judged.Projection != nil || len(c.Judged.Windows) != int(to.Sub(from).Hours())) {
			t.Errorf("hour cap judged on %s (%d windows)", c.Judged.Text, len(c.Judged.Windows))
		}
		want := teamStats(exp, m, judged, factor)
		if got := [4]uint64{uint64(c.Summary.PrincipalWindows), c.Summary.Max, uint64(c.Summary.OverCap), c.Summary.Would429}; got != want {
			t.Errorf("%s cap judged on %s: principal-windows, max, over, would-429 = %v, want %v", m, c.Judged.Text, got, want)
		}
		t.Logf("per-team %s: judged on %s: %v", m, c.Judged.Text, want)
	}
	// The hour team-b went over on day 4, named.
	hour := b.Caps[0]
	if hour.OverCapPrincipalsTotal != 1 || hour.OverCapPrincipals[0].Principal != "team-b" || hour.OverCapPrincipals[0].AboveCap != 1000 {
		t.Errorf("hour over %+v", hour.OverCapPrincipals)
	}
}

// projectionFactor is the exact factor of a projected cap: the window's
// length over its measured part (the report rounds the one it shows).
func projectionFactor(t *testing.T, c report.Cap) float64 {
	p := c.Judged.Projection
	if p == nil {
		return 1
	}
	tm := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return float64(tm(c.Judged.To).Sub(tm(c.Judged.From))) / float64(tm(p.ObservedTo).Sub(tm(p.ObservedFrom)))
}

// teamStats: principal-windows, max, over the cap and would-be 429s of a team
// measure in the judged windows, as the report computes them from the
// ledger (usage scaled by a projection's factor, rounded up).
func teamStats(exp expected, m string, judged map[string]bool, factor float64) [4]uint64 {
	var n, maxv, over, would uint64
	for _, ws := range exp.windows[m] {
		for w, used := range ws {
			if !judged[w.String()] {
				continue
			}
			v := used
			if factor != 1 {
				v = uint64(math.Ceil(float64(used) * factor))
			}
			n++
			maxv = max(maxv, v)
			if v > teamCaps[m] {
				over++
			}
		}
	}
	for w, c := range exp.teamWould429[m] {
		if judged[w.String()] {
			would += c
		}
	}
	return [4]uint64{n, maxv, over, would}
}

// checkPromotion: refused on day 6, accepted on day 8 with the report as
// evidence, a one-line diff, and the render of the promoted spec passes the gate.
func (w *week) checkPromotion(rep *report.Report) {
	t := w.t
	var evJSON bytes.Buffer
	if err := report.WriteJSON(&evJSON, rep); err != nil {
		t.Fatal(err)
	}
	evFile := filepath.Join(w.dir, "week.json")
	if err := os.WriteFile(evFile, evJSON.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(w.specFile)
	day6 := w.dayStart(6).Add(12 * time.Hour).Format(time.RFC3339)
	day8 := w.dayStart(8).Add(9 * time.Hour).Format(time.RFC3339)
	if code, out := runCLI(w.ctx, "promote", "per-api-key", "--spec", w.specFile, "--evidence", evFile, "--now", day6); code != cli.ExitFailure || !strings.Contains(out, "5 of 7 full UTC days") {
		t.Fatalf("day 6: %d %s", code, out)
	}
	// per-run's runaway keeps 5 of 77 principal-days over the cap: the evidence refuses it.
	if code, out := runCLI(w.ctx, "promote", "per-run", "--spec", w.specFile, "--evidence", evFile, "--now", day8); code != cli.ExitFailure || !strings.Contains(out, "5 of 77 principal-days over the cap") {
		t.Fatalf("per-run on day 8: %d %s", code, out)
	}
	// per-team's week cap is over: refused, naming that cap.
	if code, out := runCLI(w.ctx, "promote", "per-team", "--spec", w.specFile, "--evidence", evFile, "--now", day8); code != cli.ExitFailure || !strings.Contains(out, "tokens per week:") {
		t.Fatalf("per-team on day 8: %d %s", code, out)
	}
	if now, _ := os.ReadFile(w.specFile); !bytes.Equal(now, before) {
		t.Fatal("refused promotions changed the spec")
	}
	if code, out := runCLI(w.ctx, "promote", "per-api-key", "--spec", w.specFile, "--evidence", evFile, "--now", day8); code != cli.ExitOK {
		t.Fatalf("day 8: %d %s", code, out)
	}
	after, _ := os.ReadFile(w.specFile)
	wantLine := fmt.Sprintf("    - {name: per-api-key, perPrincipal: x-api-key-client, tokensPerDay: 50000, mode: enforce, enforcedSince: %s, shadowSince: %s, overrides: [{principal: big-batch, tokensPerDay: 500000}]}",
		w.dayStart(8).Format("2006-01-02"), w.day0)
	if changed := diffLines(string(before), string(after)); len(changed) != 2 || changed[1] != "+ "+wantLine {
		t.Fatalf("want a one-line diff, got:\n%s", strings.Join(changed, "\n"))
	}
	_ = promote.RequiredFullDays
	w.checkRenderAfterPromotion()
}

// diffLines lists the changed lines of two texts of one line count.
func diffLines(before, after string) []string {
	a, b := strings.Split(before, "\n"), strings.Split(after, "\n")
	if len(a) != len(b) {
		return []string{"line count changed"}
	}
	var changed []string
	for i := range a {
		if a[i] != b[i] {
			changed = append(changed, "- "+a[i], "+ "+b[i])
		}
	}
	return changed
}

// checkRenderAfterPromotion: per-api-key's rules (default and override)
// enforce, the others still shadow, and the gate passes the new render.
func (w *week) checkRenderAfterPromotion() {
	t := w.t
	bs2, err := spec.LoadFile(w.specFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	res2, err := render.Render(bs2)
	if err != nil {
		t.Fatal(err)
	}
	btp := res2.Objects[0].Object.(*egv1a1.BackendTrafficPolicy)
	rbs, _ := render.RuleBudgets(btp.Annotations)
	for i, rule := range btp.Spec.RateLimit.Global.Rules {
		want := rbs[i].Budget != "per-api-key"
		if rule.ShadowMode == nil || *rule.ShadowMode != want {
			t.Errorf("rule %d (%s): shadowMode %v, want %v", i, rbs[i].Budget, rule.ShadowMode, want)
		}
	}
	out := filepath.Join(w.dir, "rendered")
	if code, msg := runCLI(w.ctx, "render", w.specFile, "-o", out); code != cli.ExitOK {
		t.Fatalf("render: %s", msg)
	}
	if code, msg := runCLI(w.ctx, "assert", "--spec", w.specFile, "--skip", "BG006,BG013", out); code != cli.ExitOK {
		t.Fatalf("assert rejects the promoted output: %s", msg)
	}
}

func runCLI(ctx context.Context, args ...string) (int, string) {
	var out, errb bytes.Buffer
	code := cli.Run(ctx, args, strings.NewReader(""), &out, &errb)
	return code, out.String() + errb.String()
}

// checkBudget checks a day-cap budget's report against the test's own count.
func checkBudget(t *testing.T, rb report.Budget, exp expected) {
	t.Helper()
	if len(rb.Caps) != 1 || rb.Caps[0].Window != "day" {
		t.Fatalf("budget %s: caps %+v, want its day cap", rb.Name, rb.Caps)
	}
	b := rb.Caps[0]
	values, principals, over, above, peaks := defaultPopulation(exp, rb.Name)
	sort.Slice(values, func(i, j int) bool { return values[i] < values[j] })
	rank := func(p float64) uint64 { return values[int(math.Ceil(p/100*float64(len(values))))-1] }
	peak := values[len(values)-1]
	suggested := expectedSuggestion(values, principals, peak)
	s := b.Summary
	got := fmt.Sprintf("pd=%d principals=%d p50=%d p95=%d p99=%d max=%d over=%d above=%d would429=%d denied=%d suggested=%d days=%d",
		s.PrincipalWindows, s.Principals, s.P50, s.P95, s.P99, s.Max, s.OverCap, s.AboveCap, s.Would429, s.Denied, b.SuggestedCap, b.DaysCovered)
	want := fmt.Sprintf("pd=%d principals=%d p50=%d p95=%d p99=%d max=%d over=%d above=%d would429=%d denied=%d suggested=%d days=%d",
		len(values), principals, rank(50), rank(95), rank(99), peak, over, above, exp.would429[rb.Name], 0, suggested, 7)
	if got != want {
		t.Errorf("budget %s:\n got %s\nwant %s", rb.Name, got, want)
	}
	if !strings.Contains(b.SuggestionBasis, "headroom 1.20") {
		t.Errorf("budget %s: basis %q", rb.Name, b.SuggestionBasis)
	}
	checkOverPrincipals(t, rb.Name, b, exp, peaks)
	checkOverride(t, rb.Name, b, exp)
	t.Logf("budget %s: %s", rb.Name, got)
	js, _ := json.Marshal(b.PerWindow[6])
	t.Logf("  last day %s", js)
}

// defaultPopulation: the usage of every principal but the override.
func defaultPopulation(exp expected, budget string) (values []uint64, principals, over int, above uint64, peaks map[string]uint64) {
	peaks = map[string]uint64{}
	for p, days := range exp.usage[budget] {
		if p == "big-batch" {
			continue
		}
		principals++
		c := capOf(budget, p)
		for _, used := range days {
			values = append(values, used)
			peaks[p] = max(peaks[p], used)
			if used > c {
				over++
				above += used - c
			}
		}
	}
	return values, principals, over, above, peaks
}

// expectedSuggestion: with fewer than 20 principals, the peak x 1.2 rounded
// up to two significant digits; else by brute force, the smallest observed
// value with at most 1% above it.
func expectedSuggestion(values []uint64, principals int, peak uint64) uint64 {
	if principals < report.MinPrincipalsForPercentile {
		v := uint64(math.Ceil(float64(peak) * 1.2))
		unit := uint64(1)
		for v/unit >= 100 {
			unit *= 10
		}
		return (v + unit - 1) / unit * unit
	}
	var suggested uint64 = math.MaxUint64
	allowed := int(math.Floor(0.01 * float64(len(values))))
	for _, c := range values {
		n := 0
		for _, v := range values {
			if v > c {
				n++
			}
		}
		if n <= allowed && c < suggested {
			suggested = c
		}
	}
	return suggested
}

// checkOverPrincipals: each principal over the cap with its days over, most
// above first, and its own would-be 429s.
func checkOverPrincipals(t *testing.T, name string, b report.Cap, exp expected, peaks map[string]uint64) {
	t.Helper()
	var overNames []string
	for p, days := range exp.usage[name] {
		if p == "big-batch" {
			continue
		}
		for _, used := range days {
			if used > capOf(name, p) {
				overNames = append(overNames, p)
				break
			}
		}
	}
	if b.OverCapPrincipalsTotal != len(overNames) || len(b.OverCapPrincipals) != len(overNames) {
		t.Errorf("budget %s: over-cap principals %+v, want %v", name, b.OverCapPrincipals, overNames)
	}
	for _, po := range b.OverCapPrincipals {
		n := 0
		var pabove uint64
		for _, used := range exp.usage[name][po.Principal] {
			if c := capOf(name, po.Principal); used > c {
				n++
				pabove += used - c
			}
		}
		if len(po.WindowsOver) != n || po.AboveCap != pabove || po.MaxWindow != peaks[po.Principal] {
			t.Errorf("budget %s: principal %+v, want %d days over, %d above", name, po, n, pabove)
		}
		// Only one principal is over per day here: its would-be 429s are exact
		// and are all of the budget's.
		if !po.Would429Exact || po.Would429 != exp.would429[name] {
			t.Errorf("budget %s: principal %s would429 %d exact %v, want %d", name, po.Principal, po.Would429, po.Would429Exact, exp.would429[name])
		}
	}
}

// checkOverride: the override principal against its own cap.
func checkOverride(t *testing.T, name string, b report.Cap, exp expected) {
	t.Helper()
	days, ok := exp.usage[name]["big-batch"]
	if !ok {
		return
	}
	if len(b.Overridden) != 1 || b.Overridden[0].Principal != "big-batch" {
		t.Fatalf("budget %s: overridden %+v", name, b.Overridden)
	}
	ov := b.Overridden[0]
	var oover int
	var oabove, omax uint64
	for _, used := range days {
		omax = max(omax, used)
		if used > ov.Cap {
			oover++
			oabove += used - ov.Cap
		}
	}
	if ov.Cap != capOf(name, "big-batch") || ov.Summary.OverCap != oover || ov.Summary.AboveCap != oabove || ov.Summary.Max != omax || ov.SuggestedCap <= omax {
		t.Errorf("budget %s: override %+v, want over %d above %d max %d", name, ov, oover, oabove, omax)
	}
}

func commandStats(t *testing.T, addr string) map[string]int {
	t.Helper()
	out, err := valkeytest.Do(addr, "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		var v int
		fmt.Sscan(n, &v)
		m[strings.TrimPrefix(name, "cmdstat_")] = v
	}
	return m
}

// sent is a call sent and when.
type sent struct {
	r  request
	at time.Time
}

// checkCommandsPerCharge sends ten charges of fresh principals on header,
// then ten more of the same, and counts the Valkey commands each round sent:
// per charge one charge script (EVALSHA) setting its call id's bit, and in
// it per charged counter one INCRBY and one HINCRBY (its ledger write), and
// PEXPIREAT NX on a counter's first charge only. It returns the charges.
func (w *week) checkCommandsPerCharge(header string, counters int, at time.Time) []sent {
	t := w.t
	w.clock.Set(at)
	budget := map[string]string{"x-ar-run": "per-run", "x-team": "per-team"}[header]
	var out []sent
	probe := func() {
		for i := 0; i < 10; i++ {
			out = append(out, sent{request{header, fmt.Sprintf("probe-%d", i), budget, 10, 1, bothPhases, false}, at})
			calls, err := rlsconfig.Requests(w.routeLimits, rlsconfig.Request{
				Headers:  map[string]string{header: fmt.Sprintf("probe-%d", i), ":method": "POST", ":path": "/v1/chat/completions"},
				Metadata: map[string]string{"io.envoy.ai_gateway:llm_total_token": "10", "io.envoy.ai_gateway:budgetgen_cost": "1"},
			}, rlsconfig.PhaseStreamDone)
			if err != nil || len(calls) != 1 {
				t.Fatalf("probe descriptors: %v", err)
			}
			if _, err := w.eng.ShouldRateLimit(w.ctx, calls[0]); err != nil {
				t.Fatal(err)
			}
		}
	}
	round := func() map[string]int {
		before := commandStats(t, w.srv.Addr)
		probe()
		delta := map[string]int{}
		for name, n := range commandStats(t, w.srv.Addr) {
			// Connection set-up (valkey-go dials its pipelines lazily) is not per charge.
			if d := n - before[name]; d != 0 && name != "info" && name != "hello" && !strings.HasPrefix(name, "client|") && name != "ping" {
				delta[name] = d
			}
		}
		return delta
	}
	n := 10 * counters
	if got, want := scriptOnce(round()), map[string]int{"evalsha": 10, "setbit": 10, "incrby": n, "pexpireat": n, "hincrby": n}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: commands for 10 first charges: %v, want %v", header, got, want)
	}
	if got, want := scriptOnce(round()), map[string]int{"evalsha": 10, "setbit": 10, "incrby": n, "hincrby": n}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: commands for 10 later charges: %v, want %v", header, got, want)
	}
	return out
}

// scriptOnce drops what is not per charge: the script's load (an EVAL
// after the first NOSCRIPT on a fresh server) and the call-id bitmap's
// expiry (one PEXPIREAT a minute, when its epoch starts).
func scriptOnce(delta map[string]int) map[string]int {
	if delta["eval"] <= 1 {
		delete(delta, "eval")
	}
	if n := delta["pexpireat"]; n%10 == 1 {
		delta["pexpireat"] = n - 1
	}
	if delta["pexpireat"] == 0 {
		delete(delta, "pexpireat")
	}
	return delta
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
