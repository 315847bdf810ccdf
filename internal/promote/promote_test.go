package promote

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/report"
)

func day(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func fixture(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/flow.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// diffLines returns the lines of a that are not in b at the same place and the
// reverse, in the simplest sense valid when line counts differ by inserts only.
func onlyLineChanged(t *testing.T, before, after []byte, wantOld, wantNew string) {
	t.Helper()
	a := strings.Split(string(before), "\n")
	b := strings.Split(string(after), "\n")
	if len(a) != len(b) {
		t.Fatalf("line count changed %d -> %d:\n%s", len(a), len(b), after)
	}
	var changed []int
	for i := range a {
		if a[i] != b[i] {
			changed = append(changed, i)
		}
	}
	if len(changed) != 1 {
		t.Fatalf("want exactly one changed line, got %d:\n%s", len(changed), after)
	}
	i := changed[0]
	if a[i] != wantOld || b[i] != wantNew {
		t.Fatalf("line %d:\n- %q\n+ %q\nwant\n- %q\n+ %q", i+1, a[i], b[i], wantOld, wantNew)
	}
}

func TestFullShadowDaysBoundaries(t *testing.T) {
	since := day("2026-10-16T00:00:00Z")
	for _, tc := range []struct {
		now  string
		full int
		ok   bool
	}{
		{"2026-10-16T23:59:59Z", 0, false},
		{"2026-10-17T12:00:00Z", 0, false},
		{"2026-10-22T12:00:00Z", 5, false}, // day 6 of the scenario
		{"2026-10-23T23:59:59Z", 6, false}, // day 7: D+7 not over yet
		{"2026-10-24T00:00:00Z", 7, true},  // D+8 00:00 UTC: D+1..D+7 done
		{"2026-10-24T00:00:00+02:00", 6, false},
		{"2026-10-25T09:00:00Z", 8, true},
	} {
		full, earliest := FullShadowDays(since, day(tc.now))
		if full != tc.full || !day(tc.now).Before(earliest) != tc.ok {
			t.Errorf("now %s: full %d ok %v, want %d %v (earliest %s)", tc.now, full, !day(tc.now).Before(earliest), tc.full, tc.ok, earliest)
		}
	}
}

func TestPromoteRefusedOnDay6AcceptedOnDay8(t *testing.T) {
	src := fixture(t)
	_, _, err := Promote(src, "per-run", Options{Now: day("2026-10-22T10:00:00Z"), File: "flow.yaml"})
	var ref *RefusedError
	if !errors.As(err, &ref) {
		t.Fatalf("day 6: want refusal, got %v", err)
	}
	if !strings.Contains(err.Error(), "5 of 7 full UTC days") || !strings.Contains(err.Error(), "2026-10-24T00:00:00Z") {
		t.Errorf("refusal should say how far along and when: %v", err)
	}
	// Just before the boundary.
	if _, _, err := Promote(src, "per-run", Options{Now: day("2026-10-23T23:59:59Z")}); !errors.As(err, &ref) {
		t.Fatalf("D+7 23:59:59: want refusal, got %v", err)
	}
	out, res, err := Promote(src, "per-run", Options{Now: day("2026-10-24T08:00:00Z"), File: "flow.yaml"})
	if err != nil {
		t.Fatalf("day 8: %v", err)
	}
	onlyLineChanged(t, src, out,
		"    - {name: per-run,    perPrincipal: x-ar-run,         tokensPerDay: 5000000,  mode: shadow, shadowSince: 2026-10-16}",
		"    - {name: per-run,    perPrincipal: x-ar-run,         tokensPerDay: 5000000,  mode: enforce, enforcedSince: 2026-10-24, shadowSince: 2026-10-16}")
	if res.ChangedLines != 1 || res.From != ModeShadow || res.To != ModeEnforce || res.Date != "2026-10-24" || res.FullDays != 7 {
		t.Errorf("result %+v", res)
	}
	// Promote again: already enforced, no change.
	if _, _, err := Promote(out, "per-run", Options{Now: day("2026-10-25T08:00:00Z")}); err == nil || !strings.Contains(err.Error(), "already in enforce (since 2026-10-24)") {
		t.Errorf("second promote: %v", err)
	}
	// Demote goes back at once and restarts the shadow clock.
	back, dres, err := Demote(out, "per-run", Options{Now: day("2026-10-25T08:00:00Z")})
	if err != nil {
		t.Fatal(err)
	}
	onlyLineChanged(t, src, back,
		"    - {name: per-run,    perPrincipal: x-ar-run,         tokensPerDay: 5000000,  mode: shadow, shadowSince: 2026-10-16}",
		"    - {name: per-run,    perPrincipal: x-ar-run,         tokensPerDay: 5000000,  mode: shadow, shadowSince: 2026-10-25}")
	if dres.From != ModeEnforce || dres.To != ModeShadow {
		t.Errorf("demote result %+v", dres)
	}
}

func TestPromoteBlockStyleKeepsEverythingElse(t *testing.T) {
	src := fixture(t)
	out, res, err := Promote(src, "per-api-key", Options{Now: day("2026-10-30T00:00:00Z")})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(string(src),
		"      mode: shadow     # measured first\n",
		"      mode: enforce     # measured first\n      enforcedSince: 2026-10-30\n", 1)
	if string(out) != want {
		t.Fatalf("got:\n%s\nwant:\n%s", out, want)
	}
	if res.ChangedLines != 2 {
		t.Errorf("changed lines %d, want 2 (mode line and the recorded date)", res.ChangedLines)
	}
	back, _, err := Demote(out, "per-api-key", Options{Now: day("2026-11-02T00:00:00Z")})
	if err != nil {
		t.Fatal(err)
	}
	wantBack := strings.Replace(string(src), `shadowSince: "2026-10-16"`, `shadowSince: 2026-11-02`, 1)
	if string(back) != wantBack {
		t.Fatalf("demote got:\n%s\nwant:\n%s", back, wantBack)
	}
}

func TestPromoteMissingModeInsertsIt(t *testing.T) {
	src := fixture(t)
	out, _, err := Promote(src, "frontier", Options{Now: day("2026-10-30T00:00:00Z")})
	if err != nil {
		t.Fatal(err)
	}
	onlyLineChanged(t, src, out,
		`  frontier: {models: ["gpt-5.*"], tokensPerDay: 50000000, killSwitch: false, shadowSince: 2026-10-16}`,
		`  frontier: {models: ["gpt-5.*"], tokensPerDay: 50000000, killSwitch: false, shadowSince: 2026-10-16, mode: enforce, enforcedSince: 2026-10-30}`)
	// No shadowSince at all: refused, and --force records the reason.
	_, _, err = Promote(src, "agent-fleet", Options{Now: day("2026-10-30T00:00:00Z")})
	if err == nil || !strings.Contains(err.Error(), "no shadowSince recorded") {
		t.Fatalf("want refusal without shadowSince, got %v", err)
	}
	if _, _, err := Promote(src, "agent-fleet", Options{Now: day("2026-10-30T00:00:00Z"), Force: true}); err == nil || !strings.Contains(err.Error(), "--reason") {
		t.Fatalf("--force without reason: %v", err)
	}
	out, res, err := Promote(src, "agent-fleet", Options{Now: day("2026-10-30T00:00:00Z"), Force: true, Reason: `incident "42": runaway fleet`})
	if err != nil {
		t.Fatal(err)
	}
	onlyLineChanged(t, src, out,
		"    - {name: agent-fleet, group: {header: x-ar-kind, equals: agent}, tokensPerDay: 200000000}",
		`    - {name: agent-fleet, mode: enforce, enforcedSince: 2026-10-30, promotionReason: "incident \"42\": runaway fleet", group: {header: x-ar-kind, equals: agent}, tokensPerDay: 200000000}`)
	if !res.Forced || len(res.Overridden) != 1 {
		t.Errorf("result %+v", res)
	}
	// Demote removes the reason and the enforce date again.
	back, _, err := Demote(out, "agent-fleet", Options{Now: day("2026-10-31T00:00:00Z")})
	if err != nil {
		t.Fatal(err)
	}
	onlyLineChanged(t, src, back,
		"    - {name: agent-fleet, group: {header: x-ar-kind, equals: agent}, tokensPerDay: 200000000}",
		"    - {name: agent-fleet, mode: shadow, shadowSince: 2026-10-31, group: {header: x-ar-kind, equals: agent}, tokensPerDay: 200000000}")
}

func TestPromoteUnknownBudget(t *testing.T) {
	_, _, err := Promote(fixture(t), "per-hmuan", Options{Now: day("2026-10-30T00:00:00Z"), File: "b.yaml"})
	if !errors.Is(err, ErrUnknownBudget) || !strings.Contains(err.Error(), "agent-fleet, frontier, per-api-key, per-run") {
		t.Fatalf("got %v", err)
	}
}

func evidence(from string, days int, principalDays, over int, cap uint64) *report.Report {
	start, _ := time.Parse(report.DateLayout, from)
	c := report.Cap{Window: "day", Measure: report.MeasureTokens, Cap: cap, SuggestedCap: 6000000}
	for i := 0; i < days; i++ {
		c.PerWindow = append(c.PerWindow, report.WindowStats{Window: start.AddDate(0, 0, i).Format(report.DateLayout),
			Stats: report.Stats{PrincipalWindows: principalDays, OverCap: over}})
	}
	b := report.Budget{Name: "per-run", Caps: []report.Cap{c}}
	return &report.Report{Version: report.FormatVersion, From: from, To: start.AddDate(0, 0, days-1).Format(report.DateLayout), Days: days, Budgets: []report.Budget{b}}
}

// monthCap is a month cap judged on a window from..to, or projected.
func monthCap(from, to string, proj *report.Projection, windows, over int) report.Cap {
	return report.Cap{Window: "month", Measure: report.MeasureCost, Currency: "USD", Cap: 5_000_000,
		Judged:  report.Judged{Text: "month", From: from, To: to, Projection: proj},
		Summary: report.Stats{PrincipalWindows: windows, OverCap: over}}
}

func TestPromoteEvidence(t *testing.T) {
	src := fixture(t)
	now := day("2026-10-24T08:00:00Z")
	withMonth := func(c report.Cap) *report.Report {
		ev := evidence("2026-10-17", 7, 100, 0, 5000000)
		ev.Budgets[0].Caps = append(ev.Budgets[0].Caps, c)
		return ev
	}
	caps := map[string]uint64{"day/tokens": 5000000}
	for _, tc := range []struct {
		name     string
		ev       *report.Report
		max      float64
		specCaps map[string]uint64
		want     string // "" = accepted
	}{
		{"covers and under 1%", evidence("2026-10-17", 7, 100, 0, 5000000), 0, caps, ""},
		{"share at threshold", evidence("2026-10-17", 7, 100, 1, 5000000), 0, caps, "tokens per day: 7 of 700 principal-days"},
		{"share above custom", evidence("2026-10-17", 7, 100, 1, 5000000), 0.005, caps, "not under 0.50%"},
		{"share under custom", evidence("2026-10-17", 7, 100, 1, 5000000), 0.02, caps, ""},
		{"too few days", evidence("2026-10-18", 6, 100, 0, 5000000), 0, caps, "covers 6 of the 7"},
		{"days before shadow do not count", evidence("2026-10-15", 7, 100, 0, 5000000), 0, caps, "covers 5 of the 7"},
		{"no data", evidence("2026-10-17", 7, 0, 0, 5000000), 0, caps, "no measured principal-days"},
		{"cap changed", evidence("2026-10-17", 7, 100, 0, 4000000), 0, caps, "cap of 4000000 but the spec now says 5000000"},
		{"a cap of the spec missing from the evidence", evidence("2026-10-17", 7, 100, 0, 5000000), 0, map[string]uint64{"day/tokens": 5000000, "month/cost": 5_000_000}, "evidence has no month cost cap"},
		// A month cap judged on a whole month after shadowSince 2026-10-16: none
		// exists yet on 10-24, so a projection from 7.3 days is accepted (noted),
		// a month that started before shadow is not.
		{"month on a projection", withMonth(monthCap("", "", &report.Projection{Window: "2026-10", ObservedFrom: "2026-10-17T00:00:00Z", ObservedHours: 176, Factor: 4.2}, 40, 0)), 0, nil, ""},
		{"month projected from too few days", withMonth(monthCap("", "", &report.Projection{Window: "2026-10", ObservedFrom: "2026-10-17T00:00:00Z", ObservedHours: 100, Factor: 7.4}, 40, 0)), 0, nil, "rests on 4.2 days measured"},
		{"month before the shadow", withMonth(monthCap("2026-09-01T00:00:00Z", "2026-10-01T00:00:00Z", nil, 40, 0)), 0, nil, "starts before the first full shadow day 2026-10-17"},
		{"month over its cap", withMonth(monthCap("", "", &report.Projection{Window: "2026-10", ObservedFrom: "2026-10-17T00:00:00Z", ObservedHours: 176, Factor: 4.2}, 40, 4)), 0, nil, "cost per month: 4 of 40 principal-months over the cap"},
		{"no data, with the report's reason", func() *report.Report {
			ev := evidence("2026-10-17", 7, 0, 0, 5000000)
			ev.Budgets[0].Caps[0].NoData = "no measurements in 7 days"
			return ev
		}(), 0, caps, "no measured principal-days: no measurements in 7 days"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, res, err := Promote(src, "per-run", Options{Now: now, Evidence: tc.ev, MaxLimitedShare: tc.max, SpecCaps: tc.specCaps})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("want accepted, got %v", err)
				}
				if strings.HasPrefix(tc.name, "month on") && (len(res.Notes) != 1 || !strings.Contains(res.Notes[0], "judged on a projection of 2026-10")) {
					t.Fatalf("projection not noted: %v", res.Notes)
				}
				return
			}
			var ref *RefusedError
			if !errors.As(err, &ref) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want refusal with %q, got %v", tc.want, err)
			}
		})
	}
	// An hour cap: its windows are named by their UTC date. 168 hours from
	// UTC midnight cover 7 full shadow days; 168 hours of a report in
	// America/New_York (local midnight is 04:00Z) touch 8 UTC dates but
	// cover only 6 of them whole.
	hours := func(from string, n int) *report.Report {
		start := day(from)
		c := report.Cap{Window: "hour", Measure: report.MeasureTokens, Cap: 300000, SuggestedCap: 300000}
		for i := range n {
			c.PerWindow = append(c.PerWindow, report.WindowStats{Window: start.Add(time.Duration(i) * time.Hour).Format("2006-01-02T15Z"),
				Stats: report.Stats{PrincipalWindows: 10}})
		}
		return &report.Report{Version: report.FormatVersion, From: "2026-10-17", To: "2026-10-23", Days: 7,
			Budgets: []report.Budget{{Name: "per-run", Caps: []report.Cap{c}}}}
	}
	if _, _, err := Promote(src, "per-run", Options{Now: now, Evidence: hours("2026-10-17T00:00:00Z", 168)}); err != nil {
		t.Errorf("hour cap on 7 full UTC days: %v", err)
	}
	if _, _, err := Promote(src, "per-run", Options{Now: now, Evidence: hours("2026-10-17T04:00:00Z", 168)}); err == nil || !strings.Contains(err.Error(), "covers 6 of the 7") {
		t.Errorf("hour cap on 7 New York days (6 whole UTC days): %v, want covers 6 of the 7", err)
	}
	// An edited report that repeats a day cannot stretch 6 days into 7.
	dup := evidence("2026-10-18", 6, 100, 0, 5000000)
	c := &dup.Budgets[0].Caps[0]
	c.PerWindow = append(c.PerWindow, c.PerWindow[0])
	if _, _, err := Promote(src, "per-run", Options{Now: now, Evidence: dup}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("evidence with a repeated day: %v", err)
	}
	ev := evidence("2026-10-17", 7, 100, 0, 5000000)
	ev.Version = "v0"
	if _, _, err := Promote(src, "per-run", Options{Now: now, Evidence: ev}); err == nil || !strings.Contains(err.Error(), "regenerate") {
		t.Errorf("old evidence version: %v", err)
	}
}

func TestPromoteValidateHookAborts(t *testing.T) {
	boom := errors.New("spec: budgets[0].mode: bad")
	_, _, err := Promote(fixture(t), "per-run", Options{Now: day("2026-10-24T08:00:00Z"), Validate: func(string, []byte) error { return boom }})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "nothing written") {
		t.Fatalf("got %v", err)
	}
}

func TestWriteFileAtomicKeepsMode(t *testing.T) {
	p := filepath.Join(t.TempDir(), "b.yaml")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(p, []byte("new")); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	st, _ := os.Stat(p)
	if string(b) != "new" || st.Mode().Perm() != 0o600 {
		t.Fatalf("content %q mode %v", b, st.Mode())
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	if len(ents) != 1 {
		t.Fatalf("temporary file left behind: %v", ents)
	}
	if err := WriteFileAtomic(filepath.Join(t.TempDir(), "missing", "x.yaml"), []byte("x")); err == nil {
		t.Fatal("want error for a missing directory")
	}
}

// TestWriteFileAtomicKeepsSymlink: a spec that is a symbolic link stays one;
// its target gets the new content.
func TestWriteFileAtomicKeepsSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "shared", "budgets.yaml")
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, []byte("old"), 0o640); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "budgets.yaml")
	if err := os.Symlink(filepath.Join("shared", "budgets.yaml"), link); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(link, []byte("new")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link was replaced: %v %v", fi.Mode(), err)
	}
	b, _ := os.ReadFile(target)
	st, _ := os.Stat(target)
	if string(b) != "new" || st.Mode().Perm() != 0o640 {
		t.Fatalf("target content %q mode %v", b, st.Mode())
	}
}

func FuzzPromoteNeverCorrupts(f *testing.F) {
	b, err := os.ReadFile("testdata/flow.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b, "per-run")
	f.Add(b, "per-api-key")
	f.Add([]byte("spec:\n  budgets:\n  - name: a\n    mode: 'shadow' # c\n    shadowSince: 2026-01-01\n"), "a")
	f.Add([]byte("spec: {budgets: [{name: a, shadowSince: \"2026-01-01\"}]}"), "a")
	f.Add([]byte("spec:\r\n  budgets:\r\n  - name: a\r\n    mode: shadow\r\n    shadowSince: 2026-01-01\r\n"), "a")
	f.Add([]byte("spec:\r\n  budgets:\r\n  - name: a\r\n    shadowSince: 2026-01-01\r\n"), "a")
	f.Fuzz(func(t *testing.T, src []byte, name string) {
		out, _, err := Promote(src, name, Options{Now: day("2027-01-01T00:00:00Z"), Force: true, Reason: "fuzz"})
		if err != nil {
			return
		}
		// Whatever was accepted must re-read as the budget in enforce.
		b, _, err := locate(out, name, "fuzz")
		if err != nil {
			t.Fatalf("promoted output does not parse: %v\n%s", err, out)
		}
		if m, _ := b.scalar(fieldMode); m != ModeEnforce {
			t.Fatalf("mode %q after promote", m)
		}
		// Line endings stay: a CRLF file gets no bare LF, and a file
		// ending in a newline keeps it.
		bare := func(b []byte) int { return bytes.Count(b, []byte("\n")) - bytes.Count(b, []byte("\r\n")) }
		if bytes.Contains(src, []byte("\r\n")) && bare(src) == 0 && bare(out) != 0 {
			t.Fatalf("bare LF in a CRLF file:\n%q", out)
		}
		if bytes.HasSuffix(src, []byte("\n")) && !bytes.HasSuffix(out, []byte("\n")) {
			t.Fatalf("final newline lost:\n%q", out)
		}
	})
}

// TestForcePromoteBareFrontier: a frontier with no mode, shadowSince or name
// (valid: shadow by default) is promoted with --force, its new fields first.
func TestForcePromoteBareFrontier(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"block",
			"apiVersion: budgetgen.io/v1alpha1\nkind: BudgetSet\nmetadata: {name: s}\nspec:\n  frontier:\n    models:\n      - gpt-5.*\n    tokensPerDay: 50000000\n",
			"apiVersion: budgetgen.io/v1alpha1\nkind: BudgetSet\nmetadata: {name: s}\nspec:\n  frontier:\n    mode: enforce\n    enforcedSince: 2026-10-30\n    promotionReason: \"incident 7\"\n    models:\n      - gpt-5.*\n    tokensPerDay: 50000000\n"},
		{"flow",
			"apiVersion: budgetgen.io/v1alpha1\nkind: BudgetSet\nmetadata: {name: s}\nspec:\n  frontier: {models: [gpt-5.*], tokensPerDay: 50000000}\n",
			"apiVersion: budgetgen.io/v1alpha1\nkind: BudgetSet\nmetadata: {name: s}\nspec:\n  frontier: {mode: enforce, enforcedSince: 2026-10-30, promotionReason: \"incident 7\", models: [gpt-5.*], tokensPerDay: 50000000}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := Promote([]byte(tc.src), "frontier", Options{Now: day("2026-10-30T00:00:00Z"), Force: true, Reason: "incident 7"})
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", out, tc.want)
			}
		})
	}
}

// A spec kept with CRLF line endings (a Windows checkout without
// core.autocrlf) keeps them: a replaced plain value keeps its line's "\r",
// and inserted lines end like their neighbours. A file whose last line is
// the budget's keeps its final newline.
func TestPromoteKeepsLineEndings(t *testing.T) {
	const lf = "spec:\n  budgets:\n    - name: per-run\n      tokensPerDay: 5000000\n      mode: shadow\n      shadowSince: 2026-10-16\n"
	crlf := strings.ReplaceAll(lf, "\n", "\r\n")
	for _, tc := range []struct {
		name, src, wantPromoted, wantDemoted string
	}{
		{"lf", lf,
			strings.Replace(lf, "mode: shadow\n", "mode: enforce\n      enforcedSince: 2026-10-24\n", 1),
			strings.Replace(lf, "2026-10-16", "2026-10-25", 1)},
		{"crlf", crlf,
			strings.Replace(crlf, "mode: shadow\r\n", "mode: enforce\r\n      enforcedSince: 2026-10-24\r\n", 1),
			strings.Replace(crlf, "2026-10-16", "2026-10-25", 1)},
		{"last line lf", strings.Replace(lf, "      mode: shadow\n", "", 1),
			strings.Replace(lf, "      mode: shadow\n", "", 1) + "      mode: enforce\n      enforcedSince: 2026-10-24\n",
			strings.Replace(strings.Replace(lf, "2026-10-16", "2026-10-25", 1), "mode: shadow\n      shadowSince: 2026-10-25\n", "shadowSince: 2026-10-25\n      mode: shadow\n", 1)},
		{"last line crlf", strings.Replace(crlf, "      mode: shadow\r\n", "", 1),
			strings.Replace(crlf, "      mode: shadow\r\n", "", 1) + "      mode: enforce\r\n      enforcedSince: 2026-10-24\r\n",
			strings.Replace(strings.Replace(crlf, "2026-10-16", "2026-10-25", 1), "mode: shadow\r\n      shadowSince: 2026-10-25\r\n", "shadowSince: 2026-10-25\r\n      mode: shadow\r\n", 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := Promote([]byte(tc.src), "per-run", Options{Now: day("2026-10-24T08:00:00Z"), Force: true, Reason: "r"})
			if err != nil {
				t.Fatal(err)
			}
			want := strings.Replace(tc.wantPromoted, "enforcedSince: 2026-10-24\n", "enforcedSince: 2026-10-24\n      promotionReason: \"r\"\n", 1)
			want = strings.Replace(want, "enforcedSince: 2026-10-24\r\n", "enforcedSince: 2026-10-24\r\n      promotionReason: \"r\"\r\n", 1)
			if string(out) != want {
				t.Fatalf("promoted:\n%q\nwant:\n%q", out, want)
			}
			back, _, err := Demote(out, "per-run", Options{Now: day("2026-10-25T08:00:00Z")})
			if err != nil {
				t.Fatal(err)
			}
			if string(back) != tc.wantDemoted {
				t.Fatalf("demoted:\n%q\nwant:\n%q", back, tc.wantDemoted)
			}
		})
	}
}

// Evidence is judged on the spec it was reported with and on recent days: a
// report whose budget had another shadowSince (the budget was demoted since,
// or the report read another version of the spec) is refused, and so is one
// whose last day is more than MaxEvidenceAgeDays before today (the shadow
// week it shows is not the traffic the cap meets now).
func TestPromoteEvidenceScope(t *testing.T) {
	src := fixture(t)
	ok := func() *report.Report {
		ev := evidence("2026-10-17", 7, 100, 0, 5000000)
		ev.Budgets[0].ShadowSince = "2026-10-16"
		return ev
	}
	if _, _, err := Promote(src, "per-run", Options{Now: day("2026-10-24T08:00:00Z"), Evidence: ok()}); err != nil {
		t.Fatalf("evidence of the current spec: %v", err)
	}
	other := ok()
	other.Budgets[0].ShadowSince = "2026-10-10"
	_, _, err := Promote(src, "per-run", Options{Now: day("2026-10-24T08:00:00Z"), Evidence: other, File: "b.yaml"})
	var ref *RefusedError
	if !errors.As(err, &ref) || !strings.Contains(err.Error(), "evidence was reported with shadowSince 2026-10-10 but the spec says 2026-10-16") {
		t.Fatalf("evidence of another shadowSince: %v", err)
	}
	// The report's last day, 2026-10-23, is 7 days before 2026-10-30:
	// still accepted; a day later it is stale.
	if _, _, err := Promote(src, "per-run", Options{Now: day("2026-10-30T23:59:59Z"), Evidence: ok()}); err != nil {
		t.Fatalf("evidence ending 7 days ago: %v", err)
	}
	_, _, err = Promote(src, "per-run", Options{Now: day("2026-10-31T00:00:00Z"), Evidence: ok()})
	if !errors.As(err, &ref) || !strings.Contains(err.Error(), "evidence is stale: its last day 2026-10-23 is 8 days before today (2026-10-31); at most 7") {
		t.Fatalf("stale evidence: %v", err)
	}
	bad := ok()
	bad.To = "soon"
	if _, _, err := Promote(src, "per-run", Options{Now: day("2026-10-24T08:00:00Z"), Evidence: bad}); !errors.As(err, &ref) || !strings.Contains(err.Error(), `evidence's last day "soon"`) {
		t.Fatalf("evidence without a last day: %v", err)
	}
}

// A refusal names the spec file and the budget's line, as every other
// error of promote does.
func TestPromoteRefusalNamesFileAndLine(t *testing.T) {
	_, _, err := Promote(fixture(t), "per-api-key", Options{Now: day("2026-10-20T08:00:00Z"), File: "budgets.yaml"})
	if err == nil || !strings.HasPrefix(err.Error(), "budgets.yaml:18: promotion of per-api-key refused: in shadow since 2026-10-16") {
		t.Fatalf("got %v", err)
	}
}

// A read-only spec (chmod a-w: someone froze it) is not replaced by the
// rename, which the directory's permissions alone would allow (and root
// always): the write is refused, naming the file and its mode, and the file
// stays as it was.
func TestWriteFileAtomicRefusesReadOnly(t *testing.T) {
	p := filepath.Join(t.TempDir(), "b.yaml")
	if err := os.WriteFile(p, []byte("old"), 0o444); err != nil {
		t.Fatal(err)
	}
	err := WriteFileAtomic(p, []byte("new"))
	if err == nil || !strings.Contains(err.Error(), p+" is read-only (mode 0444)") {
		t.Fatalf("got %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Fatalf("read-only file replaced: %q", b)
	}
}

// A share bound that is not a number refuses rather than admits: the
// comparison fails closed.
func TestPromoteNaNShareFailsClosed(t *testing.T) {
	_, _, err := Promote(fixture(t), "per-run", Options{Now: day("2026-10-24T08:00:00Z"), Evidence: evidence("2026-10-17", 7, 100, 1, 5000000), MaxLimitedShare: math.NaN()})
	var ref *RefusedError
	if !errors.As(err, &ref) || !strings.Contains(err.Error(), "7 of 700 principal-days over the cap") {
		t.Fatalf("got %v", err)
	}
}

// A report that did not know the cap (run without --spec: its verdict says
// "cap unknown") counts no principal over it, so its share over the cap is
// 0 whatever the traffic: such evidence is refused, not read as "never over".
func TestPromoteEvidenceWithoutCapRefused(t *testing.T) {
	for _, specCaps := range []map[string]uint64{{"day/tokens": 5000000}, nil} {
		_, _, err := Promote(fixture(t), "per-run", Options{Now: day("2026-10-24T08:00:00Z"), Evidence: evidence("2026-10-17", 7, 100, 0, 0), SpecCaps: specCaps})
		var ref *RefusedError
		if !errors.As(err, &ref) || !strings.Contains(err.Error(), "tokens per day: evidence was measured without the cap (cap unknown): report again with --spec") {
			t.Fatalf("spec caps %v: got %v", specCaps, err)
		}
	}
}
