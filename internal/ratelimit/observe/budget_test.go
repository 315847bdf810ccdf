package observe

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/budgetgen/budgetgen/internal/ratelimit/charge"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/source"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// exampleConfig loads the repository's example rate limit configs, scoped by
// the example budget map (as the service does with --budget-map); bm edits
// the map first when non-nil.
func exampleConfig(t *testing.T, bm func(*budgetmap.Map)) (*config.Config, *budgetmap.Map) {
	t.Helper()
	root := filepath.Join("..", "..", "..", "examples")
	data, err := os.ReadFile(filepath.Join(root, "budget-map.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := budgetmap.Load(data, "budget-map.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if bm != nil {
		bm(m)
	}
	var files []config.File
	names, _ := filepath.Glob(filepath.Join(root, "ratelimit", "*.yaml"))
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, config.File{Name: filepath.Base(n), Data: b})
	}
	c, err := config.Load(files)
	if err != nil {
		t.Fatal(err)
	}
	c, err = config.Merge(source.ScopeFromMap(m), c)
	if err != nil {
		t.Fatal(err)
	}
	return c, m
}

// series gathers reg and returns the label sets of name's series, each as
// "k=v,..." sorted, mapped to its value.
func series(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[labelString(m.GetLabel())] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

func labelString(ls []*dto.LabelPair) string {
	parts := make([]string, 0, len(ls))
	for _, l := range ls {
		if l.GetValue() != "" {
			parts = append(parts, l.GetName()+"="+l.GetValue())
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// TestExampleBudgetsAtZeroBeforeTraffic: loading the example's configs and
// budget map creates, before any request, every budget's decision, token and
// usage series at zero, labelled by budget, window, mode and Gateway; no
// label carries a principal, not even the override rules' own principals.
func TestExampleBudgetsAtZeroBeforeTraffic(t *testing.T) {
	c, m := exampleConfig(t, nil)
	reg := prometheus.NewRegistry()
	o := NewMetrics(metrics.New(reg))
	o.SetConfig(c)
	decisions := series(t, reg, "ratelimit_decisions_total")
	tokens := series(t, reg, "ratelimit_tokens_charged_total")
	usage := series(t, reg, metrics.UsageMetric)
	for _, e := range m.Entries {
		gw := e.Gateway.Kind + ":" + e.Gateway.Namespace + "/" + e.Gateway.Name
		base := "budget=" + e.Budget + ",domain=" + e.Domain + ",gateway=" + gw + ",mode=" + e.Mode
		for _, out := range metrics.Outcomes {
			k := base + ",outcome=" + out + ",window=" + e.Window
			if v, ok := decisions[k]; !ok || v != 0 {
				t.Errorf("decisions %s: present %t value %v, want 0", k, ok, v)
			}
		}
		if v, ok := tokens[base+",window="+e.Window]; !ok || v != 0 {
			t.Errorf("tokens of %s: present %t value %v", base, ok, v)
		}
		if e.Kind != budgetmap.KindTokens {
			continue
		}
		k := "budget=" + e.Budget + ",gateway=" + gw + ",mode=" + e.Mode + ",rank=1,window=" + e.Window
		if v, ok := usage[k]; !ok || v != 0 {
			t.Errorf("usage %s: present %t value %v", k, ok, v)
		}
	}
	for k := range decisions {
		for _, e := range m.Entries {
			if e.OverridePrincipal != "" && strings.Contains(k, e.OverridePrincipal) {
				t.Errorf("series %s names the principal %s", k, e.OverridePrincipal)
			}
		}
		if strings.Contains(k, "/rule/") || strings.Contains(k, "rule-") {
			t.Errorf("series %s carries a config path", k)
		}
	}
}

// TestReloadDropsRemovedBudgets: a reload without a budget deletes its
// series; the others keep their counts.
func TestReloadDropsRemovedBudgets(t *testing.T) {
	c, m := exampleConfig(t, nil)
	reg := prometheus.NewRegistry()
	o := NewMetrics(metrics.New(reg))
	o.SetConfig(c)
	keep := m.Entries[0]
	var kept *config.RateLimit
	for _, l := range c.Limits() {
		if l.Budget != nil && l.Budget.Name == keep.Budget && l.Domain == keep.Domain {
			kept = l
		}
	}
	o.Descriptor(context.Background(), &Descriptor{Item: &decide.Item{Limit: kept, Hits: 7}})
	gone := "per-human"
	c2, _ := exampleConfig(t, func(m *budgetmap.Map) {
		var es []budgetmap.Entry
		for _, e := range m.Entries {
			if e.Budget != gone {
				es = append(es, e)
			}
		}
		m.Entries = es
	})
	o.SetConfig(c2)
	for k := range series(t, reg, "ratelimit_decisions_total") {
		if strings.Contains(k, "budget="+gone+",") {
			t.Errorf("series of the removed budget left: %s", k)
		}
	}
	for k := range series(t, reg, metrics.UsageMetric) {
		if strings.Contains(k, "budget="+gone+",") {
			t.Errorf("usage series of the removed budget left: %s", k)
		}
	}
	if v := testutil.ToFloat64(o.m.ForRule(metrics.KeyOf(kept)).Tokens); v != 7 {
		t.Fatalf("kept budget's tokens = %v after the reload, want 7", v)
	}
	// The rules that lost their budget are counted under readable rule names.
	found := false
	for k := range series(t, reg, "ratelimit_decisions_total") {
		found = found || (strings.Contains(k, "rule=rule/0.rule-0-match-0") && !strings.Contains(k, "budget="))
	}
	if !found {
		t.Fatal("the unbudgeted rule has no readable series")
	}
}

// reserveConfig is a config whose one rule is a reserving budget's.
func reserveConfig(t *testing.T, mode string) *config.Config {
	t.Helper()
	c, err := config.Load([]config.File{{Name: "r.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n")}})
	if err != nil {
		t.Fatal(err)
	}
	c, err = config.Merge(func(string, []config.PathEntry) config.Resolved {
		return config.Resolved{Budget: &config.Budget{Name: "per-run", Kind: "tokens", Window: "day", Mode: mode, Gateway: "agentgateway:agents/gw", Bucket: "s/per-run", Reserve: config.Reserve{Tokens: 40}}}
	}, c)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReservationCounters: holds, held tokens, denials caused only by holds
// (shadow ones included, told apart by mode) and expired hold tokens are
// counted by budget from the items' reservation fields, and exist at zero
// once the config is loaded.
func TestReservationCounters(t *testing.T) {
	for _, mode := range []string{metrics.ModeEnforce, metrics.ModeShadow} {
		reg := prometheus.NewRegistry()
		m := metrics.New(reg)
		o := NewMetrics(m)
		c := reserveConfig(t, mode)
		o.SetConfig(c)
		bk := metrics.BudgetKey{Budget: "per-run", Window: "day", Mode: mode, Gateway: "agentgateway:agents/gw"}
		r := m.ForReservation(bk)
		if got := []float64{testutil.ToFloat64(r.Holds), testutil.ToFloat64(r.HeldTokens), testutil.ToFloat64(r.Denials), testutil.ToFloat64(r.ExpiredTokens)}; got[0]+got[1]+got[2]+got[3] != 0 ||
			len(series(t, reg, "ratelimit_reservation_denials_total")) != 1 {
			t.Fatalf("%s: reservation series not at zero after load: %v", mode, got)
		}
		l := c.Limits()[0]
		for _, it := range []decide.Item{
			{Limit: l, Reserve: 40, Held: true, Reserved: 40},
			{Limit: l, Reserve: 40, Held: true, Reserved: 80, Expired: 40},
			{Limit: l, Reserve: 40, Over: true, ReserveDenied: true, Reserved: 80},
			{Limit: l, Hits: 30, Expired: 5},
		} {
			o.Descriptor(context.Background(), &Descriptor{Item: &it})
		}
		want := "holds=2 held=80 denials=1 expired=45"
		got := "holds=" + ftoa(testutil.ToFloat64(r.Holds)) + " held=" + ftoa(testutil.ToFloat64(r.HeldTokens)) +
			" denials=" + ftoa(testutil.ToFloat64(r.Denials)) + " expired=" + ftoa(testutil.ToFloat64(r.ExpiredTokens))
		if got != want {
			t.Errorf("%s: %s, want %s", mode, got, want)
		}
		// The limit's own shadow_mode decides the outcome (this config has
		// none); the budget's mode labels the series.
		if v := testutil.ToFloat64(m.Decision(metrics.KeyOf(l), metrics.OutcomeOverLimit)); v != 1 {
			t.Errorf("%s: over_limit decisions = %v, want 1", mode, v)
		}
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// TestUsageGaugeTracksTopPrincipals: the usage gauge reports the highest
// ratios of the budget's principals, from store answers only (not the
// over-limit cache, not a failed store call), and restarts with the window.
func TestUsageGaugeTracksTopPrincipals(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	reg := prometheus.NewRegistry()
	m := metrics.NewWith(reg, metrics.Options{TopPrincipals: 2, Now: func() time.Time { return now }})
	o := NewMetrics(m)
	c := reserveConfig(t, metrics.ModeEnforce)
	o.SetConfig(c)
	l := c.Limits()[0]
	start, end := now.Unix()-10, now.Unix()+100
	item := func(key string, total uint64) decide.Item {
		return decide.Item{Limit: l, Hits: 1, Total: total, Key: []byte(key), WindowStart: start, WindowEnd: end}
	}
	for _, d := range []Descriptor{
		{Item: ptr(item("alice", 50))},
		{Item: ptr(item("bob", 20))},
		{Item: ptr(item("carol", 90))},
		{Item: ptr(item("bob", 30))},   // below the top 2
		{Item: ptr(item("alice", 95))}, // alice passes carol
		{Item: &decide.Item{Limit: l, Hits: 1, Total: 0, Key: []byte("dave"), Cached: true, WindowStart: start, WindowEnd: end}}, // cached: no total
		{Item: ptr(item("erin", 99)), StoreFailed: true}, // failed: no total
	} {
		o.Descriptor(context.Background(), &d)
	}
	got := series(t, reg, metrics.UsageMetric)
	base := "budget=per-run,gateway=agentgateway:agents/gw,mode=enforce,rank="
	if got[base+"1,window=day"] != 0.95 || got[base+"2,window=day"] != 0.9 || len(got) != 2 {
		t.Fatalf("usage %v", got)
	}
	// A new window: the old principals are gone.
	start, end = end, end+100
	o.Descriptor(context.Background(), &Descriptor{Item: ptr(item("bob", 10))})
	got = series(t, reg, metrics.UsageMetric)
	if got[base+"1,window=day"] != 0.1 || len(got) != 1 {
		t.Fatalf("usage after the window changed %v", got)
	}
	// The window ended with no call since: rank 1 reads 0.
	now = time.Unix(end, 0)
	if got = series(t, reg, metrics.UsageMetric); got[base+"1,window=day"] != 0 || len(got) != 1 {
		t.Fatalf("usage after the window ended %v", got)
	}
}

func ptr[T any](v T) *T { return &v }

// TestKnownLabelValuesMatchTheirSources: the label values New creates at
// zero are the ones the producing packages use.
func TestKnownLabelValuesMatchTheirSources(t *testing.T) {
	eq := func(what string, got, want []string) {
		t.Helper()
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: metrics has %v, the source %v", what, got, want)
		}
	}
	eq("request codes", metrics.RequestCodes, []string{RequestOK, RequestOverLimit, RequestInvalid, RequestUnavailable})
	eq("unsent outcomes", metrics.UnsentOutcomes, []string{charge.UnsentDeferred, charge.UnsentDropped, charge.UnsentRefused, charge.UnsentSaturated})
	eq("failure policies", metrics.FailurePolicies, decide.FailurePolicyNames)
	if (&source.Files{}).Name() != metrics.ConfigSources[0] {
		t.Errorf("file source is %q", (&source.Files{}).Name())
	}
	reasons := map[string]bool{}
	for _, r := range metrics.StoreErrorReasons {
		reasons[r] = true
	}
	for _, err := range []error{context.DeadlineExceeded, store.ErrUnavailable, store.ErrMalformedReply, store.ErrOverflow, store.ErrFull, store.ErrRefused, errors.New("x")} {
		if r := ErrReason(err); !reasons[r] {
			t.Errorf("ErrReason(%v) = %q is not pre-created", err, r)
		}
	}
}
