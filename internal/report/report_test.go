package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
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

func mapping() Mapping {
	return Mapping{
		Rules: map[ledger.RuleID]RuleInfo{
			ruleRun: {Budget: "per-run", Kind: KindTokens, Cap: 1000},
			ruleKey: {Budget: "per-api-key", Kind: KindTokens, Cap: 500},
			ruleOvr: {Budget: "per-api-key", Kind: KindTokens, Principal: "acme-batch", Cap: 5000},
			ruleKS:  {Budget: "frontier", Kind: KindKillSwitch},
		},
		Budgets: map[string]BudgetInfo{
			"per-run":     {Mode: "shadow", Cap: 1000},
			"per-api-key": {Mode: "enforce", Cap: 500, Overrides: map[string]uint64{"acme-batch": 5000}},
			"frontier":    {Mode: "shadow", Cap: 100000},
		},
	}
}

// data: 7 days of per-run with 10 steady principals at 100*i, one runaway
// (run-x) at 3000 on the last two days; per-api-key with client a at 400 and
// acme-batch (override rule) at 4000..6000.
func data() []ledger.DayData {
	var out []ledger.DayData
	first := ledger.DayOf(now) - 7
	for i := 0; i < 7; i++ {
		d := first + ledger.Day(i)
		run := ledger.DayData{Rule: ruleRun, Day: d, Usage: map[string]uint64{}}
		for p := 1; p <= 10; p++ {
			run.Usage[ledger.EncodePrincipal([]string{"run-" + string(rune('a'+p))})] = uint64(100 * p)
		}
		if i >= 5 {
			run.Usage["run-x"] = 3000
			run.ShadowDenials = 4
		}
		out = append(out, run)
		out = append(out, ledger.DayData{Rule: ruleKey, Day: d, Usage: map[string]uint64{"a": 400}})
		out = append(out, ledger.DayData{Rule: ruleOvr, Day: d, Usage: map[string]uint64{"": uint64(4000 + 333*i)}, EnforceDenials: uint64(i / 4)})
		out = append(out, ledger.DayData{Rule: ruleKS, Day: d, ShadowDenials: 9})
	}
	// Outside the window: ignored.
	out = append(out, ledger.DayData{Rule: ruleRun, Day: first - 1, Usage: map[string]uint64{"run-z": 1 << 40}})
	out = append(out, ledger.DayData{Rule: ruleRun, Day: first + 7, Usage: map[string]uint64{"run-z": 1 << 40}})
	// A rule the spec does not know.
	out = append(out, ledger.DayData{Rule: ruleOld, Day: first + 3, Usage: map[string]uint64{"q": 7}})
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

func TestBuildNumbers(t *testing.T) {
	r := build(t)
	if r.From != "2026-10-17" || r.To != "2026-10-23" || r.Days != 7 {
		t.Fatalf("window %s..%s %d", r.From, r.To, r.Days)
	}
	names := []string{}
	for _, b := range r.Budgets {
		names = append(names, b.Name)
	}
	if !reflect.DeepEqual(names, []string{"frontier", "per-api-key", "per-run", "rule ai-gateway/old/rule/0"}) {
		t.Fatalf("budgets %v", names)
	}
	run := find(t, r, "per-run")
	s := run.Summary
	// 70 steady principal-days (100..1000 each day) + 2 runaway ones.
	if s.PrincipalDays != 72 || s.Principals != 11 || s.Max != 3000 || s.OverCap != 2 || s.TokensAboveCap != 4000 || s.Would429 != 8 || s.Denied != 0 {
		t.Fatalf("per-run summary %+v", s)
	}
	// Sorted values: 7 each of 100..1000, then 3000, 3000. p50: rank 36 -> 600 (29..35 are 500); p95: rank 69 -> 1000; p99: rank 72 -> 3000.
	if s.P50 != 600 || s.P95 != 1000 || s.P99 != 3000 {
		t.Fatalf("percentiles %d %d %d", s.P50, s.P95, s.P99)
	}
	if s.LimitedShare != 2.0/72 || run.DaysCovered != 7 {
		t.Fatalf("share %v covered %d", s.LimitedShare, run.DaysCovered)
	}
	// 1% of 72 = 0 principal-days may be above: the max. (2.8% would allow 2: 1000.)
	if run.SuggestedCap != 3000 {
		t.Fatalf("suggested %d", run.SuggestedCap)
	}
	if day := run.PerDay[6]; day.Date != "2026-10-23" || day.Principals != 11 || day.OverCap != 1 || day.Would429 != 4 {
		t.Fatalf("last day %+v", day)
	}
	key := find(t, r, "per-api-key")
	// acme-batch at 4000+333i against its own 5000 cap: over on i=4,5,6 (5332, 5665, 5998).
	if key.Summary.OverCap != 3 || key.Summary.TokensAboveCap != 332+665+998 || key.Summary.Denied != 3 || key.Summary.Principals != 2 {
		t.Fatalf("per-api-key %+v", key.Summary)
	}
	// The override's days do not move the default suggested cap.
	if key.SuggestedCap != 400 {
		t.Fatalf("per-api-key suggested %d", key.SuggestedCap)
	}
	fr := find(t, r, "frontier")
	if fr.Summary.PrincipalDays != 0 || fr.DaysCovered != 0 || fr.Summary.Would429 != 0 {
		t.Fatalf("kill switch rule counted as tokens: %+v", fr)
	}
	want := []string{
		"budget frontier: measurements on 0 of 7 days (2026-10-17..2026-10-23); a promotion needs 7 full days",
		"budget rule ai-gateway/old/rule/0: measurements on 1 of 7 days (2026-10-17..2026-10-23); a promotion needs 7 full days",
		"rule ai-gateway/old/rule/0 (domain ai-gateway/old) has measurements but no budget in the spec: stale policy or another spec",
	}
	if !reflect.DeepEqual(r.Warnings, want) {
		t.Fatalf("warnings %q", r.Warnings)
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
	for _, o := range []Options{{}, {Now: now, Days: -1}, {Now: now, Days: 1000}, {Now: now, TargetLimitedShare: 1.5}} {
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
	if back.Version != FormatVersion || len(back.Budgets) != 4 || back.Budgets[2].Summary.OverCap != 2 || len(back.Budgets[2].PerDay) != 7 {
		t.Fatalf("%+v", back)
	}
}

func TestHTMLElements(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteHTML(&buf, build(t)); err != nil {
		t.Fatal(err)
	}
	h := buf.String()
	if n := strings.Count(h, "<svg "); n != 3 { // per-api-key, per-run, the unmapped rule; frontier has no data
		t.Fatalf("%d charts", n)
	}
	for _, name := range []string{"per-run", "per-api-key"} {
		re := regexp.MustCompile(`(?s)<svg class="chart" data-budget="` + name + `".*?</svg>`)
		svg := re.FindString(h)
		if svg == "" {
			t.Fatalf("no chart for %s", name)
		}
		if strings.Count(svg, `<line class="cap"`) != 1 || !strings.Contains(svg, `<rect class="bar"`) || strings.Count(svg, `<line class="suggested"`) != 1 {
			t.Fatalf("chart for %s lacks a cap line, bars or the suggestion:\n%s", name, svg)
		}
	}
	// The runaway's bin is drawn past the cap line in the per-run chart.
	re := regexp.MustCompile(`(?s)data-budget="per-run".*?<line class="cap" x1="([0-9.]+)"`)
	if re.FindStringSubmatch(h) == nil {
		t.Fatal("no cap x")
	}
	if !strings.Contains(h, "No measurements in this window.") {
		t.Fatal("frontier without data should say so")
	}
	for _, bad := range []string{"<script", "<link", "src=", "href=", "@import", "url("} {
		if strings.Contains(h, bad) {
			t.Fatalf("external asset or script: %s", bad)
		}
	}
}

func TestHTMLEscapesNames(t *testing.T) {
	m := Mapping{Rules: map[ledger.RuleID]RuleInfo{ruleRun: {Budget: `<script>alert(1)</script>`, Kind: KindTokens, Cap: 10}}}
	r, err := Build([]ledger.DayData{{Rule: ruleRun, Day: ledger.DayOf(now) - 1, Usage: map[string]uint64{"a": 5}}}, m, Options{Now: now})
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
	m := Mapping{Rules: map[ledger.RuleID]RuleInfo{ruleRun: {Budget: evil, Kind: KindTokens, Cap: 10}}}
	r, err := Build([]ledger.DayData{{Rule: ruleRun, Day: ledger.DayOf(now) - 1, Usage: map[string]uint64{"a": 5}}}, m, Options{Now: now})
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
