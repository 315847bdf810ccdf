package report

import (
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// hourCapReport is an hour cap in America/New_York measured every hour from
// local midnight of from to the report's today (2026-10-24).
func hourCapReport(t *testing.T, from int) Cap {
	t.Helper()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip(err)
	}
	m := Mapping{
		Rules:   map[ledger.RuleID]RuleInfo{ruleRun: {Budget: "per-run", Kind: budgetmap.KindTokens, Measure: MeasureTokens, Scale: 1}},
		Budgets: map[string]BudgetInfo{"per-run": {Mode: "shadow", Caps: map[CapKey]CapInfo{{ledger.PeriodHour, MeasureTokens}: {Cap: 1000}}}},
	}
	var data []ledger.Data
	end := time.Date(2026, 10, 24, 0, 0, 0, 0, ny)
	for h := time.Date(2026, 10, from, 0, 0, 0, 0, ny); h.Before(end); h = h.Add(time.Hour) {
		data = append(data, ledger.Data{Rule: ruleRun, Window: ledger.WindowAt(ledger.PeriodHour, h, ny), Usage: map[string]uint64{"a": 10}})
	}
	r, err := Build(data, m, Options{Now: time.Date(2026, 10, 24, 8, 0, 0, 0, ny), Location: ny})
	if err != nil {
		t.Fatal(err)
	}
	return r.Budgets[0].Caps[0]
}

// An hour cap's days are the report's days in its zone: hours are named by
// their UTC date, and 6 days of New York's hours touch 7 UTC dates.
func TestHourCapDaysCoveredInZone(t *testing.T) {
	c := hourCapReport(t, 18) // 2026-10-18..2026-10-23: 6 of the 7 days
	if c.DaysCovered != 6 || c.Verdict.Status != VerdictNotYet {
		t.Errorf("6 local days of hours: daysCovered %d, verdict %+v; want 6, not yet", c.DaysCovered, c.Verdict)
	}
	c = hourCapReport(t, 17) // every day of the report
	if c.DaysCovered != 7 || c.Verdict.Status != VerdictReady {
		t.Errorf("7 local days of hours: daysCovered %d, verdict %+v; want 7, ready", c.DaysCovered, c.Verdict)
	}
}

// The day shadowing started (shadowSince) is partial: a day cap's verdict
// weighs the full shadow days only, as promote --evidence does.
func TestShadowSinceDayIsNotAFullDay(t *testing.T) {
	first := ledger.DayOf(now) - 7
	var data []ledger.Data
	for i := 0; i < 7; i++ {
		u := map[string]uint64{}
		n := 10
		if i == 0 {
			n = 100 // the shadowSince day dilutes the share
		}
		for p := 0; p < n; p++ {
			u[ledger.EncodePrincipal1(string(rune('a'+p%26))+string(rune('a'+p/26)))] = 100
		}
		if i == 3 {
			u["runaway"] = 5000
		}
		data = append(data, dd(ruleRun, first+ledger.Day(i), u, ledger.Denials{}, nil))
	}
	var daily []DailyTotal
	build := func(since ledger.Day) Cap {
		m := Mapping{
			Rules:   map[ledger.RuleID]RuleInfo{ruleRun: {Budget: "per-run", Kind: budgetmap.KindTokens, Measure: MeasureTokens, Scale: 1}},
			Budgets: map[string]BudgetInfo{"per-run": {Mode: "shadow", ShadowSince: since.String(), Caps: dayCap(1000)}},
		}
		r, err := Build(data, m, Options{Now: now})
		if err != nil {
			t.Fatal(err)
		}
		daily = r.Budgets[0].Daily
		return r.Budgets[0].Caps[0]
	}
	c := build(first)
	if len(daily) != 7 || !daily[0].Partial || daily[1].Partial {
		t.Errorf("daily totals %+v: want the shadowSince day, and only it, partial", daily)
	}
	if c.DaysCovered != 6 || c.Verdict.Status != VerdictNotYet || len(c.Verdict.Reasons) != 2 ||
		!strings.Contains(c.Verdict.Reasons[0], "measured on 6 of the 7 full days") || !strings.Contains(c.Verdict.Reasons[1], "1 of 61 principal-days") {
		t.Errorf("shadow since the first day: daysCovered %d, verdict %+v; want 6 days and 1 of 61 over", c.DaysCovered, c.Verdict)
	}
	if !c.PerWindow[0].Partial || c.Summary.PrincipalWindows != 161 {
		t.Errorf("the shadowSince day is partial and still in the sums: %+v, %d principal-days", c.PerWindow[0], c.Summary.PrincipalWindows)
	}
	c = build(first - 1)
	if c.DaysCovered != 7 || c.Verdict.Status != VerdictReady {
		t.Errorf("shadow since the day before: daysCovered %d, verdict %+v; want 7, ready (1 of 161 over)", c.DaysCovered, c.Verdict)
	}
}
