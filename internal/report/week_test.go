package report_test

// The simulated week of issue 6: a spec in shadow, Envoy Gateway's rate limit
// traffic for seven full UTC days from several principal profiles (steady,
// bursty, a runaway agent, an override client) through the real decision
// engine and the Valkey store, then the report checked against numbers the
// test computes itself from what it sent, then promotion refused on day 6 and
// accepted on day 8 with the report as evidence.

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
	"github.com/prometheus/client_golang/prometheus/testutil"
	vk "github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/cli"
	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/promote"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/engine"
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

  budgets:
    # A runaway agent is expected to show up here.
    - {name: per-run, perPrincipal: x-ar-run, tokensPerDay: 100000, mode: shadow, shadowSince: DAY0}
    - {name: per-api-key, perPrincipal: x-api-key-client, tokensPerDay: 50000, mode: shadow, shadowSince: DAY0, overrides: [{principal: big-batch, tokensPerDay: 500000}]}
`

type simClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *simClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *simClock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// request is one LLM call of a principal: its header and its token count.
type request struct {
	header, principal string
	budget            string
	tokens            uint64
}

// day k (1..7) traffic, in sending order.
func traffic(k int) []request {
	var out []request
	run := func(p string, n int, tok uint64) {
		for i := 0; i < n; i++ {
			out = append(out, request{"x-ar-run", p, "per-run", tok})
		}
	}
	key := func(p string, n int, tok uint64) {
		for i := 0; i < n; i++ {
			out = append(out, request{"x-api-key-client", p, "per-api-key", tok})
		}
	}
	for i := 0; i < 10; i++ { // steady runs: 5 calls a day, 40k-44.5k of 100k
		run(fmt.Sprintf("run-s%02d", i), 5, uint64(8000+100*i))
	}
	if k >= 3 { // the runaway agent: 40 calls of 5k from day 3 (200k of 100k)
		run("run-agent", 40, 5000)
	} else {
		run("run-agent", 2, 5000)
	}
	for i := 0; i < 15; i++ { // steady API clients: 12k-14.8k of 50k
		key(fmt.Sprintf("key-s%02d", i), 4, uint64(3000+50*i))
	}
	for i := 0; i < 4; i++ { // bursty clients: 4k a day, 47k (94%) on their burst day
		if k == 2+i {
			key(fmt.Sprintf("key-b%d", i), 10, 4700)
		} else {
			key(fmt.Sprintf("key-b%d", i), 2, 2000)
		}
	}
	// The override client: 300k of its own 500k cap, 600k on day 7.
	if k == 7 {
		key("big-batch", 6, 100000)
	} else {
		key("big-batch", 3, 100000)
	}
	return out
}

// expected holds what the test computes itself from what it sent.
type expected struct {
	usage    map[string]map[string]map[int]uint64 // budget -> principal -> day -> tokens
	would429 map[string]uint64                    // budget -> request-path checks over the cap
	crossing map[string]int                       // threshold percent -> count
}

func capOf(budget, principal string) uint64 {
	switch {
	case budget == "per-run":
		return 100000
	case principal == "big-batch":
		return 500000
	}
	return 50000
}

func TestSimulatedWeek(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	ctx := context.Background()

	// Valkey expires keys on its own clock, so the simulated week lies in
	// its future: shadowing starts tomorrow (day 0).
	day0 := ledger.DayOf(time.Now()) + 1
	dayStart := func(k int) time.Time { return (day0 + ledger.Day(k)).Start() }
	dir := t.TempDir()
	specFile := filepath.Join(dir, "budgets.yaml")
	if err := os.WriteFile(specFile, []byte(strings.ReplaceAll(weekSpec, "DAY0", day0.String())), 0o644); err != nil {
		t.Fatal(err)
	}
	bs, err := spec.LoadFile(specFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := render.Render(bs)
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
	routeLimits, err := rlsconfig.RouteRateLimits(btps[0])
	if err != nil {
		t.Fatal(err)
	}

	clock := &simClock{t: dayStart(1)}
	st, err := valkey.New(valkey.Options{Addresses: []string{srv.Addr}, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	vc, err := vk.NewClient(vk.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	lv := ledger.NewValkey(vc, "")
	rec, err := ledger.NewRecorder(ledger.Options{}, lv, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var logMu sync.Mutex
	reg := prometheus.NewRegistry()
	det, err := thresholds.New(thresholds.Options{Logger: slog.New(slog.NewJSONHandler(&lockedWriter{w: &logs, mu: &logMu}, nil)), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Options{Store: st, Now: clock.Now, Ledger: rec, Thresholds: det, StoreTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	eng.SetConfig(cfg)

	// At most one extra command per charge: ten charges of fresh principals
	// (below the cap, so none is answered from the local cache) cost ten
	// INCRBY, ten HINCRBY and, as each is its counter's first, ten
	// PEXPIREAT NX; ten more charges of the same principals cost ten INCRBY
	// and ten HINCRBY, nothing else.
	checkCommandsPerCharge(t, srv.Addr, eng, routeLimits, clock, dayStart(0).Add(10*time.Hour))

	exp := expected{usage: map[string]map[string]map[int]uint64{}, would429: map[string]uint64{}, crossing: map[string]int{}}
	add := func(b, p string, k int, n uint64) {
		if exp.usage[b] == nil {
			exp.usage[b] = map[string]map[int]uint64{}
		}
		if exp.usage[b][p] == nil {
			exp.usage[b][p] = map[int]uint64{}
		}
		exp.usage[b][p][k] += n
	}
	calls := 0
	deadline := time.Now().Add(2 * time.Minute)
	for k := 1; k <= 7; k++ {
		reqs := traffic(k)
		step := 20 * time.Hour / time.Duration(len(reqs))
		for i, r := range reqs {
			if time.Now().After(deadline) {
				t.Fatal("simulated week took more than 2 minutes")
			}
			clock.Set(dayStart(k).Add(time.Hour + time.Duration(i)*step))
			hreq := rlsconfig.Request{Headers: map[string]string{r.header: r.principal, ":method": "POST", ":path": "/v1/chat/completions"},
				Metadata: map[string]string{"io.envoy.ai_gateway:llm_total_token": fmt.Sprint(r.tokens)}}
			// Request path: a check (cost 0). In shadow mode Envoy gets OK either way.
			before := exp.usage[r.budget][r.principal][k]
			if before > capOf(r.budget, r.principal) {
				exp.would429[r.budget]++
			}
			for _, phase := range []rlsconfig.Phase{rlsconfig.PhaseRequest, rlsconfig.PhaseStreamDone} {
				calls2, err := rlsconfig.Requests(routeLimits, hreq, phase)
				if err != nil || len(calls2) != 1 {
					t.Fatalf("descriptors for %+v: %v %d", r, err, len(calls2))
				}
				resp, err := eng.ShouldRateLimit(ctx, calls2[0])
				if err != nil {
					t.Fatal(err)
				}
				if resp.OverallCode != rlpb.RateLimitResponse_OK {
					t.Fatalf("shadow mode answered %v", resp.OverallCode)
				}
				calls++
			}
			add(r.budget, r.principal, k, r.tokens)
		}
		// End of the day: deferred over-limit charges and the ledger's batch.
		eng.Flush()
		if err := rec.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d ShouldRateLimit calls over 7 simulated days", calls)

	// Threshold crossings expected from the daily totals.
	for b, ps := range exp.usage {
		for p, days := range ps {
			for _, used := range days {
				for _, pct := range []int{80, 90, 100} {
					if used >= thresholds.Threshold(capOf(b, p), pct) {
						exp.crossing[fmt.Sprint(pct)]++
					}
				}
			}
		}
	}
	logMu.Lock()
	events := strings.Count(logs.String(), `"event":"budget_threshold"`)
	logMu.Unlock()
	total := 0
	for pct, n := range exp.crossing {
		total += n
		got := 0.0
		for _, rule := range []string{"gw/week-router/rule/0", "gw/week-router/rule/1", "gw/week-router/rule/2"} {
			got += testutil.ToFloat64(det.Collector().(*prometheus.CounterVec).WithLabelValues("gw/week-router", rule, "day", pct))
		}
		if int(got) != n {
			t.Errorf("threshold %s%%: counter %v, want %d", pct, got, n)
		}
	}
	if events != total || total != 26 {
		t.Errorf("threshold events %d, expected %d (hand count 26)", events, total)
	}

	// The report, as budgetgen report would build it, on day 8.
	clock.Set(dayStart(8).Add(8 * time.Hour))
	mapping, err := report.MappingFromSpec(bs)
	if err != nil {
		t.Fatal(err)
	}
	ropts := report.Options{Now: clock.Now(), Days: 7}
	windows, err := report.ReadWindows(ropts)
	if err != nil {
		t.Fatal(err)
	}
	data, err := ledger.ReadAll(ctx, lv, windows)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := report.Build(data, mapping, ropts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.From != dayStart(1).Format("2006-01-02") || rep.To != dayStart(7).Format("2006-01-02") || len(rep.Warnings) != 0 {
		t.Fatalf("window %s..%s warnings %q", rep.From, rep.To, rep.Warnings)
	}
	for _, b := range rep.Budgets {
		checkBudget(t, b, exp)
	}

	// Promotion: refused on day 6, accepted on day 8 with the report as evidence.
	var evJSON bytes.Buffer
	if err := report.WriteJSON(&evJSON, rep); err != nil {
		t.Fatal(err)
	}
	evFile := filepath.Join(dir, "week.json")
	if err := os.WriteFile(evFile, evJSON.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(specFile)
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := cli.Run(ctx, args, strings.NewReader(""), &out, &errb)
		return code, out.String() + errb.String()
	}
	day6 := dayStart(6).Add(12 * time.Hour).Format(time.RFC3339)
	day8 := dayStart(8).Add(9 * time.Hour).Format(time.RFC3339)
	if code, out := run("promote", "per-api-key", "--spec", specFile, "--evidence", evFile, "--now", day6); code != cli.ExitFailure || !strings.Contains(out, "5 of 7 full UTC days") {
		t.Fatalf("day 6: %d %s", code, out)
	}
	// per-run's runaway keeps 5 of 77 principal-days over the cap: the evidence refuses it.
	if code, out := run("promote", "per-run", "--spec", specFile, "--evidence", evFile, "--now", day8); code != cli.ExitFailure || !strings.Contains(out, "5 of 77 principal-days over the cap") {
		t.Fatalf("per-run on day 8: %d %s", code, out)
	}
	if now, _ := os.ReadFile(specFile); !bytes.Equal(now, before) {
		t.Fatal("refused promotions changed the spec")
	}
	if code, out := run("promote", "per-api-key", "--spec", specFile, "--evidence", evFile, "--now", day8); code != cli.ExitOK {
		t.Fatalf("day 8: %d %s", code, out)
	}
	after, _ := os.ReadFile(specFile)
	a, b := strings.Split(string(before), "\n"), strings.Split(string(after), "\n")
	if len(a) != len(b) {
		t.Fatalf("promotion changed the line count:\n%s", after)
	}
	var changed []string
	for i := range a {
		if a[i] != b[i] {
			changed = append(changed, "- "+a[i], "+ "+b[i])
		}
	}
	wantLine := fmt.Sprintf("    - {name: per-api-key, perPrincipal: x-api-key-client, tokensPerDay: 50000, mode: enforce, enforcedSince: %s, shadowSince: %s, overrides: [{principal: big-batch, tokensPerDay: 500000}]}",
		dayStart(8).Format("2006-01-02"), day0)
	if len(changed) != 2 || changed[1] != "+ "+wantLine {
		t.Fatalf("want a one-line diff, got:\n%s", strings.Join(changed, "\n"))
	}
	_ = promote.RequiredFullDays

	// Render again: per-api-key's rules (default and override) enforce, per-run still shadows.
	bs2, err := spec.LoadFile(specFile, nil)
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
	out := filepath.Join(dir, "rendered")
	if code, msg := run("render", specFile, "-o", out); code != cli.ExitOK {
		t.Fatalf("render: %s", msg)
	}
	if code, msg := run("assert", "--spec", specFile, "--skip", "BG006", out); code != cli.ExitOK {
		t.Fatalf("assert rejects the promoted output: %s", msg)
	}
}

func checkBudget(t *testing.T, rb report.Budget, exp expected) {
	t.Helper()
	if len(rb.Caps) != 1 || rb.Caps[0].Window != "day" {
		t.Fatalf("budget %s: caps %+v, want its day cap", rb.Name, rb.Caps)
	}
	b := rb.Caps[0]
	name := rb.Name
	// The default rule's population: every principal but the override.
	var values []uint64
	var over int
	var above uint64
	principals := 0
	peaks := map[string]uint64{}
	for p, days := range exp.usage[name] {
		if p == "big-batch" {
			continue
		}
		principals++
		c := capOf(name, p)
		for _, used := range days {
			values = append(values, used)
			peaks[p] = max(peaks[p], used)
			if used > c {
				over++
				above += used - c
			}
		}
	}
	sort.Slice(values, func(i, j int) bool { return values[i] < values[j] })
	rank := func(p float64) uint64 { return values[int(math.Ceil(p/100*float64(len(values))))-1] }
	// Suggested cap: with fewer than 20 principals, the peak x 1.2 rounded
	// up to two significant digits; else by brute force, the smallest
	// observed value with at most 1% above it.
	peak := values[len(values)-1]
	var suggested uint64 = math.MaxUint64
	if principals < report.MinPrincipalsForPercentile {
		v := uint64(math.Ceil(float64(peak) * 1.2))
		unit := uint64(1)
		for v/unit >= 100 {
			unit *= 10
		}
		suggested = (v + unit - 1) / unit * unit
	} else {
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
	}
	if suggested <= peak && principals < report.MinPrincipalsForPercentile {
		t.Errorf("budget %s: suggestion %d not above the peak %d", name, suggested, peak)
	}
	s := b.Summary
	got := fmt.Sprintf("pd=%d principals=%d p50=%d p95=%d p99=%d max=%d over=%d above=%d would429=%d denied=%d suggested=%d days=%d",
		s.PrincipalWindows, s.Principals, s.P50, s.P95, s.P99, s.Max, s.OverCap, s.AboveCap, s.Would429, s.Denied, b.SuggestedCap, b.DaysCovered)
	want := fmt.Sprintf("pd=%d principals=%d p50=%d p95=%d p99=%d max=%d over=%d above=%d would429=%d denied=%d suggested=%d days=%d",
		len(values), principals, rank(50), rank(95), rank(99), peak, over, above, exp.would429[name], 0, suggested, 7)
	if got != want {
		t.Errorf("budget %s:\n got %s\nwant %s", name, got, want)
	}
	if !strings.Contains(b.SuggestionBasis, "headroom 1.20") {
		t.Errorf("budget %s: basis %q", name, b.SuggestionBasis)
	}
	// Principals over the cap: each with its days over, most above first.
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
	// The override, against its own cap.
	if days, ok := exp.usage[name]["big-batch"]; ok {
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
	t.Logf("budget %s: %s", name, got)
	js, _ := json.Marshal(b.PerWindow[6])
	t.Logf("  last day %s", js)
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

func checkCommandsPerCharge(t *testing.T, addr string, eng *engine.Engine, routeLimits map[string][]*routev3.RateLimit, clock *simClock, at time.Time) {
	t.Helper()
	clock.Set(at)
	probe := func() {
		for i := 0; i < 10; i++ {
			calls, err := rlsconfig.Requests(routeLimits, rlsconfig.Request{
				Headers:  map[string]string{"x-ar-run": fmt.Sprintf("probe-%d", i), ":method": "POST", ":path": "/v1/chat/completions"},
				Metadata: map[string]string{"io.envoy.ai_gateway:llm_total_token": "10"},
			}, rlsconfig.PhaseStreamDone)
			if err != nil || len(calls) != 1 {
				t.Fatalf("probe descriptors: %v", err)
			}
			if _, err := eng.ShouldRateLimit(context.Background(), calls[0]); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := commandStats(t, addr)
	probe()
	after := commandStats(t, addr)
	delta := map[string]int{}
	for name, n := range after {
		// Connection set-up (valkey-go dials its pipelines lazily) is not per charge.
		if d := n - before[name]; d != 0 && name != "info" && name != "hello" && !strings.HasPrefix(name, "client|") && name != "ping" {
			delta[name] = d
		}
	}
	want := map[string]int{"incrby": 10, "pexpireat": 10, "hincrby": 10}
	if fmt.Sprint(delta) != fmt.Sprint(want) {
		t.Fatalf("commands for 10 first charges: %v, want %v", delta, want)
	}
	before = after
	probe()
	after = commandStats(t, addr)
	delta = map[string]int{}
	for name, n := range after {
		if d := n - before[name]; d != 0 && name != "info" && name != "hello" && !strings.HasPrefix(name, "client|") && name != "ping" {
			delta[name] = d
		}
	}
	want = map[string]int{"incrby": 10, "hincrby": 10}
	if fmt.Sprint(delta) != fmt.Sprint(want) {
		t.Fatalf("commands for 10 later charges: %v, want %v", delta, want)
	}
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
