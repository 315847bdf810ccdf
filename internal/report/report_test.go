package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

var update = flag.Bool("update", false, "rewrite golden files")

var (
	now     = time.Date(2026, 10, 24, 8, 0, 0, 0, time.UTC)
	ruleRun = ledger.RuleID{Domain: "ai-gateway/ai-budgets-agent-router", Rule: "ai-gateway/ai-budgets-agent-router/rule/0"}
	ruleKey = ledger.RuleID{Domain: "ai-gateway/ai-budgets-agent-router", Rule: "ai-gateway/ai-budgets-agent-router/rule/1"}
	ruleOvr = ledger.RuleID{Domain: "ai-gateway/ai-budgets-agent-router", Rule: "ai-gateway/ai-budgets-agent-router/rule/2"}
	ruleKS  = ledger.RuleID{Domain: "ai-gateway/ai-budgets-agent-router", Rule: "ai-gateway/ai-budgets-agent-router/rule/3"}
	ruleOld = ledger.RuleID{Domain: "ai-gateway/old", Rule: "ai-gateway/old/rule/0"}
)

func dayCap(c uint64) map[CapKey]CapInfo {
	return map[CapKey]CapInfo{{ledger.PeriodDay, MeasureTokens}: {Cap: c}}
}

func mapping() Mapping {
	tok := func(budget, principal string) RuleInfo {
		return RuleInfo{Budget: budget, Kind: budgetmap.KindTokens, Principal: principal, Measure: MeasureTokens, Scale: 1}
	}
	return Mapping{
		Rules: map[ledger.RuleID]RuleInfo{
			ruleRun: tok("per-run", ""),
			ruleKey: tok("per-api-key", ""),
			ruleOvr: tok("per-api-key", "acme-batch"),
			ruleKS:  {Budget: "frontier", Kind: budgetmap.KindKillSwitch},
		},
		Budgets: map[string]BudgetInfo{
			"per-run":     {Mode: "shadow", Caps: dayCap(1000), Reserve: "200"},
			"per-api-key": {Mode: "enforce", Caps: dayCap(500), Overrides: map[string]map[CapKey]CapInfo{"acme-batch": dayCap(5000)}},
			"frontier":    {Mode: "shadow", Caps: dayCap(100000)},
		},
	}
}

// dd is one rule-day of ledger data.
func dd(rule ledger.RuleID, d ledger.Day, usage map[string]uint64, denials ledger.Denials, per map[string]ledger.Denials) ledger.Data {
	return ledger.Data{Rule: rule, Window: ledger.DayWindow(d), Usage: usage, Denials: denials, PrincipalDenials: per}
}

// data: 7 days of per-run with 10 steady principals at 100*i, one runaway
// (run-x) at 3000 on the last two days; per-run reserves 200 tokens a call:
// 50 holds a day, 65 on the runaway's days, one of whose would-be 429s is
// due to reservations alone, and on the last day a hold expired; per-api-key
// with client a at 400 and acme-batch (override rule) at 4000..6000.
func data() []ledger.Data {
	var out []ledger.Data
	first := ledger.DayOf(now) - 7
	for i := 0; i < 7; i++ {
		d := first + ledger.Day(i)
		run := dd(ruleRun, d, map[string]uint64{}, ledger.Denials{}, nil)
		for p := 1; p <= 10; p++ {
			run.Usage[ledger.EncodePrincipal([]string{"run-" + string(rune('a'+p))})] = uint64(100 * p)
		}
		run.Holds = ledger.Holds{Count: 50, Held: 50 * 200}
		if i >= 5 {
			run.Usage["run-x"] = 3000
			run.Denials = ledger.Denials{Shadow: 4, Reserve: 1}
			run.PrincipalDenials = map[string]ledger.Denials{"run-x": {Shadow: 4, Reserve: 1}}
			run.Holds = ledger.Holds{Count: 65, Held: 65 * 200}
		}
		if i == 6 {
			run.Holds.Expired = 200
		}
		out = append(out, run,
			dd(ruleKey, d, map[string]uint64{"a": 400}, ledger.Denials{}, nil),
			dd(ruleOvr, d, map[string]uint64{"": uint64(4000 + 333*i)}, ledger.Denials{Enforce: uint64(i / 4)}, nil),
			dd(ruleKS, d, nil, ledger.Denials{Shadow: 9}, nil))
	}
	// Outside the window: ignored.
	out = append(out, dd(ruleRun, first-1, map[string]uint64{"run-z": 1 << 40}, ledger.Denials{}, nil))
	out = append(out, dd(ruleRun, first+7, map[string]uint64{"run-z": 1 << 40}, ledger.Denials{}, nil))
	// A rule the spec does not know.
	out = append(out, dd(ruleOld, first+3, map[string]uint64{"q": 7}, ledger.Denials{}, nil))
	return out
}

func build(t *testing.T) *Report {
	t.Helper()
	r, err := Build(data(), mapping(), Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func find(t *testing.T, r *Report, name string) Budget {
	t.Helper()
	for _, b := range r.Budgets {
		if b.Name == name {
			return b
		}
	}
	t.Fatalf("no budget %s in %v", name, r.Budgets)
	return Budget{}
}

// capOf is a budget's cap of a window and measure.
func capOf(t *testing.T, b Budget, window, measure string) Cap {
	t.Helper()
	for _, c := range b.Caps {
		if c.Window == window && c.Measure == measure {
			return c
		}
	}
	t.Fatalf("budget %s has no %s per %s cap: %+v", b.Name, measure, window, b.Caps)
	return Cap{}
}

func TestBuildNumbers(t *testing.T) {
	r := build(t)
	if r.From != "2026-10-17" || r.To != "2026-10-23" || r.Days != 7 || r.TimeZone != "UTC" {
		t.Fatalf("window %s..%s %d %s", r.From, r.To, r.Days, r.TimeZone)
	}
	names := []string{}
	for _, b := range r.Budgets {
		names = append(names, b.Name)
	}
	if !reflect.DeepEqual(names, []string{"frontier", "per-api-key", "per-run", "rule ai-gateway/old/rule/0"}) {
		t.Fatalf("budgets %v", names)
	}
	checkPerRun(t, r)
	checkPerAPIKey(t, r)
	checkFrontierAndSummary(t, r)
}

// checkPerRun: 10 steady principals and a runaway over its cap two days.
func checkPerRun(t *testing.T, r *Report) {
	t.Helper()
	run := capOf(t, find(t, r, "per-run"), "day", MeasureTokens)
	s := run.Summary
	// 70 steady principal-days (100..1000 each day) + 2 runaway ones.
	if s.PrincipalWindows != 72 || s.Principals != 11 || s.Max != 3000 || s.OverCap != 2 || s.AboveCap != 4000 || s.Would429 != 8 || s.Denied != 0 {
		t.Fatalf("per-run summary %+v", s)
	}
	// Sorted values: 7 each of 100..1000, then 3000, 3000. p50: rank 36 -> 600 (29..35 are 500); p95: rank 69 -> 1000; p99: rank 72 -> 3000.
	if s.P50 != 600 || s.P95 != 1000 || s.P99 != 3000 {
		t.Fatalf("percentiles %d %d %d", s.P50, s.P95, s.P99)
	}
	// Reservations: the rule's totals over the judged days.
	if s.Holds != 5*50+2*65 || s.Held != 200*s.Holds || s.Expired != 200 || s.ReserveDenied != 2 || find(t, r, "per-run").Reserve != "200" {
		t.Fatalf("per-run reservations %+v", s)
	}
	if s.LimitedShare != 2.0/72 || run.DaysCovered != 7 || run.WindowsCovered != 7 || run.Judged.Text != "7 days 2026-10-17..2026-10-23" {
		t.Fatalf("share %v covered %d %q", s.LimitedShare, run.DaysCovered, run.Judged.Text)
	}
	// 11 principals: too few for a percentile, so the peak x 1.2 headroom.
	if run.SuggestedCap != 3600 || !strings.Contains(run.SuggestionBasis, "observed peak 3,000 x headroom 1.20: 11 principals") {
		t.Fatalf("suggested %d (%s)", run.SuggestedCap, run.SuggestionBasis)
	}
	if len(run.OverCapPrincipals) != 1 || run.OverCapPrincipalsTotal != 1 {
		t.Fatalf("over-cap principals %+v", run.OverCapPrincipals)
	}
	if po := run.OverCapPrincipals[0]; po.Principal != "run-x" || po.Cap != 1000 || !reflect.DeepEqual(po.WindowsOver, []string{"2026-10-22", "2026-10-23"}) ||
		po.AboveCap != 4000 || po.MaxWindow != 3000 || po.Would429 != 8 || !po.Would429Exact {
		t.Fatalf("run-x %+v", po)
	}
	if day := run.PerWindow[6]; day.Window != "2026-10-23" || day.Principals != 11 || day.OverCap != 1 || day.Would429 != 4 || day.Holds != 65 || day.Expired != 200 || day.ReserveDenied != 1 {
		t.Fatalf("last day %+v", day)
	}
	// 2 of 72 principal-days over: not ready, with the suggestion.
	if v := run.Verdict; v.Status != VerdictNotYet || len(v.Reasons) != 1 || !strings.Contains(v.Reasons[0], "2 of 72 principal-days over the cap (2.78%), not under 1.00%: raise it to the suggested 3,600") {
		t.Fatalf("per-run verdict %+v", v)
	}
}

// checkPerAPIKey: the default rule's population apart from the override's.
func checkPerAPIKey(t *testing.T, r *Report) {
	t.Helper()
	key := capOf(t, find(t, r, "per-api-key"), "day", MeasureTokens)
	// The default rule's population is client a alone; acme-batch is its own.
	if key.Summary.OverCap != 0 || key.Summary.Denied != 0 || key.Summary.Principals != 1 || key.Summary.Max != 400 || key.OverCapPrincipalsTotal != 0 {
		t.Fatalf("per-api-key default %+v", key.Summary)
	}
	// The override's days do not move the default suggested cap.
	if key.SuggestedCap != 480 {
		t.Fatalf("per-api-key suggested %d", key.SuggestedCap)
	}
	// acme-batch at 4000+333i against its own 5000 cap: over on i=4,5,6 (5332, 5665, 5998).
	if len(key.Overridden) != 1 {
		t.Fatalf("overridden %+v", key.Overridden)
	}
	ov := key.Overridden[0]
	if ov.Principal != "acme-batch" || ov.Cap != 5000 || ov.Summary.OverCap != 3 || ov.Summary.AboveCap != 332+665+998 || ov.Summary.Denied != 3 || ov.WindowsCovered != 7 ||
		ov.SuggestedCap != 7200 || !strings.Contains(ov.SuggestionBasis, "override") {
		t.Fatalf("acme-batch %+v", ov)
	}
	if key.Verdict.Status != VerdictEnforced || find(t, r, "per-api-key").Verdict.Status != VerdictEnforced {
		t.Fatalf("an enforced budget: %+v", key.Verdict)
	}
}

// checkFrontierAndSummary: a budget without data, the warnings, the
// summary rows and a budget's days.
func checkFrontierAndSummary(t *testing.T, r *Report) {
	t.Helper()
	fr := capOf(t, find(t, r, "frontier"), "day", MeasureTokens)
	if fr.Summary.PrincipalWindows != 0 || fr.DaysCovered != 0 || fr.Summary.Would429 != 0 {
		t.Fatalf("kill switch rule counted as tokens: %+v", fr)
	}
	if fr.SuggestedCap != 0 || fr.NoData == "" || r.NoData != "" || fr.Verdict.Status != VerdictNotYet {
		t.Fatalf("frontier without data: %+v; report %q", fr, r.NoData)
	}
	want := []string{
		"budget frontier: day cap measured on 0 of 7 days (2026-10-17..2026-10-23); a promotion needs 7 full days",
		"budget rule ai-gateway/old/rule/0: day cap measured on 1 of 7 days (2026-10-17..2026-10-23); a promotion needs 7 full days",
		"rule ai-gateway/old/rule/0 (domain ai-gateway/old) has measurements but no budget in the spec: stale policy or another spec",
	}
	if !reflect.DeepEqual(r.Warnings, want) {
		t.Fatalf("warnings %q", r.Warnings)
	}
	// The summary: one row per cap, in budget order.
	if len(r.Summary) != 4 || r.Summary[2].Budget != "per-run" || r.Summary[2].PrincipalsOver != 1 || r.Summary[2].Would429 != 8 ||
		r.Summary[2].SuggestedCap != 3600 || r.Summary[2].Verdict.Status != VerdictNotYet || r.Summary[1].PrincipalsOver != 1 {
		t.Fatalf("summary %+v", r.Summary)
	}
	// The days of a budget: tokens and the largest principal per day.
	if d := find(t, r, "per-run").Daily; len(d) != 7 || d[6].Tokens != 5500+3000 || d[6].MaxPrincipal != 3000 || d[6].PrincipalsOver != 1 || d[6].Would429 != 4 || d[6].Cap != 1000 {
		t.Fatalf("daily %+v", d)
	}
}

func TestBuildOnlyAndErrors(t *testing.T) {
	r, err := Build(data(), mapping(), Options{Now: now, Only: []string{"per-run"}})
	if err != nil || len(r.Budgets) != 1 {
		t.Fatalf("only: %v %v", err, r)
	}
	if _, err := Build(data(), mapping(), Options{Now: now, Only: []string{"per-rnu"}}); !errors.Is(err, ErrUnknownBudget) || !strings.Contains(err.Error(), "per-run") {
		t.Fatalf("unknown budget: %v", err)
	}
	for _, o := range []Options{{}, {Now: now, Days: -1}, {Now: now, Days: 1000}, {Now: now, TargetLimitedShare: 1.5}, {Now: now, Headroom: 1}, {Now: now, Headroom: 0.5}, {Now: now, Headroom: 11}, {Now: now, TopN: -1}} {
		if _, err := Build(nil, Mapping{}, o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

func TestPercentileAndSuggestCap(t *testing.T) {
	v := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for p, want := range map[int]uint64{50: 5, 90: 9, 95: 10, 99: 10, 100: 10, 1: 1} {
		if got := Percentile(v, p); got != want {
			t.Errorf("p%d = %d, want %d", p, got, want)
		}
	}
	if Percentile(nil, 50) != 0 || SuggestCap(nil, 0.01) != 0 {
		t.Error("empty")
	}
	// 200 values 1..200: 1% = 2 may be above -> cap 198.
	var w []uint64
	for i := 200; i >= 1; i-- {
		w = append(w, uint64(i))
	}
	if got := SuggestCap(w, 0.01); got != 198 {
		t.Errorf("suggest %d", got)
	}
	// Property: at most share of values are above the suggestion, and one less would not do.
	for _, share := range []float64{0.01, 0.05, 0.5} {
		c := SuggestCap(w, share)
		above := 0
		for _, x := range w {
			if x > c {
				above++
			}
		}
		if float64(above) > share*float64(len(w)) {
			t.Errorf("share %v: %d above %d", share, above, c)
		}
		above = 0
		for _, x := range w {
			if x > c-1 {
				above++
			}
		}
		if float64(above) <= share*float64(len(w)) {
			t.Errorf("share %v: %d is not the smallest", share, c)
		}
	}
}

func TestGolden(t *testing.T) {
	r := build(t)
	for _, f := range Formats {
		t.Run(f, func(t *testing.T) {
			w, err := WriterFor(f)
			if err != nil {
				t.Fatal(err)
			}
			var a, b bytes.Buffer
			if err := w(&a, r); err != nil {
				t.Fatal(err)
			}
			if err := w(&b, build(t)); err != nil || !bytes.Equal(a.Bytes(), b.Bytes()) {
				t.Fatal("same input, different output")
			}
			ext := map[string]string{FormatText: "txt", FormatJSON: "json", FormatMarkdown: "md", FormatHTML: "html"}[f]
			golden := filepath.Join("testdata", "week."+ext)
			if *update {
				if err := os.WriteFile(golden, a.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./pkg/report -update)", err)
			}
			if !bytes.Equal(a.Bytes(), want) {
				t.Fatalf("%s differs from %s (run with -update after checking):\n%s", f, golden, a.String())
			}
		})
	}
	if _, err := WriterFor("yaml"); err == nil || !strings.Contains(err.Error(), "text, json, markdown, html") {
		t.Fatalf("unknown format: %v", err)
	}
}

func TestJSONRoundTripsAsEvidence(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, build(t)); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Version != FormatVersion || len(back.Budgets) != 4 || back.Budgets[2].Caps[0].Summary.OverCap != 2 || len(back.Budgets[2].Caps[0].PerWindow) != 7 {
		t.Fatalf("%+v", back)
	}
}

func TestHTMLElements(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteHTML(&buf, build(t)); err != nil {
		t.Fatal(err)
	}
	h := buf.String()
	// A histogram per cap with data (per-api-key, per-run, the unmapped
	// rule; frontier has none), and a chart of days per budget with data.
	if n := strings.Count(h, `data-chart="histogram"`); n != 3 {
		t.Fatalf("%d histograms", n)
	}
	if n := strings.Count(h, `data-chart="days"`); n != 3 {
		t.Fatalf("%d day charts", n)
	}
	// The summary table comes first, before any budget section.
	if s, b := strings.Index(h, `<table class="summary">`), strings.Index(h, `<section class="budget"`); s < 0 || s > b {
		t.Fatal("the summary table is not first")
	}
	if !strings.Contains(h, `<td class="verdict v-not-yet">not yet<br>2 of 72 principal-days over the cap`) || !strings.Contains(h, `<td class="verdict v-enforced">enforced</td>`) {
		t.Fatal("summary verdicts missing")
	}
	for _, name := range []string{"per-run", "per-api-key"} {
		re := regexp.MustCompile(`(?s)<section class="budget" id="budget-` + name + `">.*?<svg class="chart" data-chart="histogram".*?</svg>`)
		svg := re.FindString(h)
		if svg == "" {
			t.Fatalf("no chart for %s", name)
		}
		svg = svg[strings.LastIndex(svg, "<svg"):]
		if strings.Count(svg, `<line class="cap"`) != 1 || !strings.Contains(svg, `<rect class="bar"`) || strings.Count(svg, `<line class="suggested"`) != 1 {
			t.Fatalf("chart for %s lacks a cap line, bars or the suggestion:\n%s", name, svg)
		}
	}
	// The per-day chart marks the days principals went over.
	if !strings.Contains(h, `<text class="label overlabel"`) || !strings.Contains(h, `<rect class="daybar"`) {
		t.Fatal("no marks of principals over in the day chart")
	}
	if !strings.Contains(h, "no measurements in 7 days 2026-10-17..2026-10-23") {
		t.Fatal("frontier without data should say so")
	}
	for _, bad := range []string{"<script", "<link", "src=", "@import", "url("} {
		if strings.Contains(h, bad) {
			t.Fatalf("external asset or script: %s", bad)
		}
	}
	if strings.Contains(h, "&gt;=0") || strings.Contains(h, ">=0") {
		t.Fatal("a would-be 429 count reads >=0")
	}
}

func TestHTMLEscapesNames(t *testing.T) {
	m := Mapping{Rules: map[ledger.RuleID]RuleInfo{ruleRun: {Budget: `<script>alert(1)</script>`, Kind: budgetmap.KindTokens, Measure: MeasureTokens, Scale: 1}}}
	r, err := Build([]ledger.Data{dd(ruleRun, ledger.DayOf(now)-1, map[string]uint64{"a": 5}, ledger.Denials{}, nil)}, m, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteHTML(&buf, r); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "<script>") {
		t.Fatal("budget name not escaped")
	}
}

// TestTextAndMarkdownEscapeNames: a budget name from the ledger cannot put a
// workflow command, a terminal escape or a table break into the text and
// Markdown reports.
func TestTextAndMarkdownEscapeNames(t *testing.T) {
	evil := "run\n::error file=x::forged\r\x1b[31m|cell"
	m := Mapping{Rules: map[ledger.RuleID]RuleInfo{ruleRun: {Budget: evil, Kind: budgetmap.KindTokens, Measure: MeasureTokens, Scale: 1}}}
	r, err := Build([]ledger.Data{dd(ruleRun, ledger.DayOf(now)-1, map[string]uint64{"a": 5}, ledger.Denials{}, nil)}, m, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	for name, write := range map[string]func(io.Writer, *Report) error{"text": WriteText, "markdown": WriteMarkdown} {
		var buf bytes.Buffer
		if err := write(&buf, r); err != nil {
			t.Fatal(err)
		}
		out := buf.String()
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(strings.TrimLeft(l, " \t"), "::") {
				t.Errorf("%s: forged workflow command %q", name, l)
			}
		}
		if strings.ContainsAny(out, "\r\x1b") {
			t.Errorf("%s: control characters left:\n%q", name, out)
		}
		want := `run\n::error file=x::forged\r\x1b[31m|cell`
		if name == "markdown" {
			want = `run ::error file=x::forged \x1b\[31m\|cell`
		}
		if !strings.Contains(out, want) {
			t.Errorf("%s: escaped name %q not in\n%s", name, want, out)
		}
	}
}

// todayData adds today's traffic (partial): run-x already over.
func todayData() []ledger.Data {
	return []ledger.Data{dd(ruleRun, ledger.DayOf(now), map[string]uint64{"run-x": 2500, "run-b": 50}, ledger.Denials{Shadow: 2}, map[string]ledger.Denials{"run-x": {Shadow: 2}})}
}

func TestIncludeToday(t *testing.T) {
	var all []ledger.Data
	for _, d := range data() {
		if d.Window.Day != ledger.DayOf(now) { // data() has a runaway today, to test it stays out
			all = append(all, d)
		}
	}
	all = append(all, todayData()...)
	// Without --include-today, today's data stays out.
	r, err := Build(all, mapping(), Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if run := capOf(t, find(t, r, "per-run"), "day", MeasureTokens); len(run.PerWindow) != 7 || run.Summary.PrincipalWindows != 72 || r.PartialDay != "" {
		t.Fatalf("today leaked into the window: %+v", run.Summary)
	}
	r, err = Build(all, mapping(), Options{Now: now, IncludeToday: true})
	if err != nil {
		t.Fatal(err)
	}
	run := capOf(t, find(t, r, "per-run"), "day", MeasureTokens)
	last := run.PerWindow[len(run.PerWindow)-1]
	if r.PartialDay != "2026-10-24" || r.To != "2026-10-23" || len(run.PerWindow) != 8 || !last.Partial || last.Window != "2026-10-24" || last.PrincipalWindows != 2 || last.Would429 != 2 {
		t.Fatalf("partial day: %q %+v", r.PartialDay, last)
	}
	if run.PerWindow[6].Partial || run.DaysCovered != 7 || run.Summary.PrincipalWindows != 74 {
		t.Fatalf("completed days: %+v covered %d", run.Summary, run.DaysCovered)
	}
	if po := run.OverCapPrincipals[0]; len(po.WindowsOver) != 3 || po.AboveCap != 5500 || po.Would429 != 10 || !po.Would429Exact {
		t.Fatalf("run-x with today: %+v", po)
	}
	var text, md, h, js bytes.Buffer
	for _, wb := range []struct {
		w   Writer
		buf *bytes.Buffer
	}{{WriteText, &text}, {WriteMarkdown, &md}, {WriteHTML, &h}, {WriteJSON, &js}} {
		if err := wb.w(wb.buf, r); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string][]string{
		"text":     {"2026-10-17..2026-10-23 + 2026-10-24 (partial: today so far)", "2026-10-24 (partial)"},
		"markdown": {"2026-10-24 (partial: today so far)", "| 2026-10-24 (partial) |"},
		"html":     {`<tr class="partial"><td>2026-10-24 (partial)</td>`, "2026-10-24 (partial: today so far)"},
		"json":     {`"partialDay": "2026-10-24"`, `"partial": true`},
	} {
		got := map[string]string{"text": text.String(), "markdown": md.String(), "html": h.String(), "json": js.String()}[name]
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s lacks %q:\n%s", name, w, got)
			}
		}
	}
}

func TestNoDataSaysWhy(t *testing.T) {
	// Only today has traffic: the window is empty and says to include today.
	r, err := Build(todayData(), mapping(), Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	want := "no measurements in 2026-10-17..2026-10-23: the window ends yesterday; today's traffic is not in it, use --include-today"
	capWant := "no measurements in 7 days 2026-10-17..2026-10-23: the report ends yesterday; today's traffic is not in it, use --include-today"
	if r.NoData != want || capOf(t, find(t, r, "per-run"), "day", MeasureTokens).NoData != capWant {
		t.Fatalf("no data: %q / %q", r.NoData, capOf(t, find(t, r, "per-run"), "day", MeasureTokens).NoData)
	}
	var text, md bytes.Buffer
	_ = WriteText(&text, r)
	_ = WriteMarkdown(&md, r)
	for _, out := range []string{text.String(), md.String()} {
		if !strings.Contains(out, "use --include-today") || strings.Contains(out, "suggested cap: 0") || strings.Contains(out, "Suggested cap **0**") {
			t.Fatalf("no-data report:\n%s", out)
		}
	}
	// Nothing anywhere: says so, without the hint.
	r, _ = Build(nil, mapping(), Options{Now: now})
	if !strings.Contains(r.NoData, "today has none either") {
		t.Fatalf("empty ledger: %q", r.NoData)
	}
}

func TestTopNAndSharedBuckets(t *testing.T) {
	// 30 principals over a cap of 100 by 1..30 tokens, one day.
	d := ledger.DayOf(now) - 1
	row := dd(ruleRun, d, map[string]uint64{}, ledger.Denials{}, nil)
	for i := 1; i <= 30; i++ {
		row.Usage[fmt.Sprintf("p%02d", i)] = uint64(100 + i)
	}
	m := Mapping{Rules: map[ledger.RuleID]RuleInfo{ruleRun: {Budget: "b", Kind: budgetmap.KindTokens, Measure: MeasureTokens, Scale: 1}}, Budgets: map[string]BudgetInfo{"b": {Caps: dayCap(100)}}}
	r, err := Build([]ledger.Data{row}, m, Options{Now: now, TopN: 3})
	if err != nil {
		t.Fatal(err)
	}
	b := r.Budgets[0].Caps[0]
	if b.OverCapPrincipalsTotal != 30 || len(b.OverCapPrincipals) != 3 || b.OverCapPrincipals[0].Principal != "p30" || b.OverCapPrincipals[2].Principal != "p28" {
		t.Fatalf("top 3: %d %+v", b.OverCapPrincipalsTotal, b.OverCapPrincipals)
	}
	// No denials recorded: exactly 0 each.
	if b.OverCapPrincipals[0].Would429Exact != true || b.OverCapPrincipals[0].Would429 != 0 {
		t.Fatalf("no denials recorded, so exact 0: %+v", b.OverCapPrincipals[0])
	}
	// 30 principals and 30 principal-days: a 1% share allows none above, so
	// the suggestion is the peak with headroom, never the peak itself.
	if b.SuggestedCap != 160 || !strings.Contains(b.SuggestionBasis, "30 principal-windows, too few") {
		t.Fatalf("suggested %d (%s)", b.SuggestedCap, b.SuggestionBasis)
	}
	var md bytes.Buffer
	_ = WriteMarkdown(&md, r)
	if !strings.Contains(md.String(), "top 3 of 30 by usage above the cap") || !strings.Contains(md.String(), "| p30 | 100 | 1 (2026-10-23) | 30 | 130 | 0 |") {
		t.Fatalf("markdown:\n%s", md.String())
	}
	// A shared bucket (group): the peak x headroom, whatever the count.
	m.Budgets["b"] = BudgetInfo{Caps: dayCap(100), Group: true}
	r, _ = Build([]ledger.Data{row}, m, Options{Now: now, Headroom: 1.5})
	if b := r.Budgets[0].Caps[0]; b.SuggestedCap != 200 || !strings.Contains(b.SuggestionBasis, "x headroom 1.50: shared bucket") {
		t.Fatalf("shared: %d (%s)", b.SuggestedCap, b.SuggestionBasis)
	}
	// Many principals: a percentile, no headroom.
	row.Usage = map[string]uint64{}
	for i := 1; i <= 300; i++ {
		row.Usage[fmt.Sprintf("q%03d", i)] = uint64(i)
	}
	m.Budgets["b"] = BudgetInfo{Caps: dayCap(100)}
	r, _ = Build([]ledger.Data{row}, m, Options{Now: now})
	if b := r.Budgets[0].Caps[0]; b.SuggestedCap != 297 || !strings.Contains(b.SuggestionBasis, "at most 1.00% of 300 principal-windows above it (3 above, 300 principals)") {
		t.Fatalf("percentile: %d (%s)", b.SuggestedCap, b.SuggestionBasis)
	}
}

func TestRoundUp2(t *testing.T) {
	for in, want := range map[uint64]uint64{0: 0, 7: 7, 99: 99, 100: 100, 101: 110, 6281480: 6300000, 3600: 3600, 3601: 3700} {
		if got := roundUp2(in); got != want {
			t.Errorf("roundUp2(%d) = %d, want %d", in, got, want)
		}
	}
	// Never the peak: even a headroom that rounds to nothing adds one.
	if c, _ := suggestPeak(5, "x", 1.01); c <= 5 {
		t.Fatalf("peak 5 -> %d", c)
	}
}
