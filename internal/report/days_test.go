package report

import (
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
