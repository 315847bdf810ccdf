package report

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// With the budget map the service records one row per bucket: the report
// names the budget once, the principal's total across Gateways, its cap
// (override included).
func TestReportNamesABucketOnce(t *testing.T) {
	doc := `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: s}
spec:
  gateways: [{namespace: edge, name: gw1}, {namespace: edge, name: gw2}, {namespace: agents, name: agw, kind: agentgateway}]
  identities: {x-user: {jwtClaim: sub}}
  budgets:
    - {name: per-user, perPrincipal: x-user, tokensPerDay: 1000, overrides: [{principal: vip, tokensPerDay: 3000}]}
`
	bs, err := spec.Load([]byte(doc), "s.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := MappingFromSpec(bs)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	day := ledger.DayOf(now) - 1
	data := []ledger.Data{{
		Rule: ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-user"}, Window: ledger.DayWindow(day),
		Usage: map[string]uint64{"u1": 1200, "vip": 2900},
		// vip is an override: its denial belongs to its own population.
		Denials: ledger.Denials{Shadow: 3}, PrincipalDenials: map[string]ledger.Denials{"u1": {Shadow: 2}, "vip": {Shadow: 1}},
	}}
	r, err := Build(data, m, Options{Now: now, Days: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Budgets) != 1 || r.Budgets[0].Name != "per-user" {
		t.Fatalf("budgets = %+v, want per-user once", r.Budgets)
	}
	b := r.Budgets[0]
	if len(b.Rules) != 1 || b.Rules[0] != "s/per-user" {
		t.Errorf("rules = %v, want the one bucket", b.Rules)
	}
	if len(r.Warnings) != 0 {
		t.Errorf("warnings: %v", r.Warnings)
	}
	c := b.Caps[0]
	if c.Summary.Principals != 1 || c.Summary.OverCap != 1 || c.Summary.Would429 != 2 || len(c.Overridden) != 1 ||
		c.Overridden[0].Cap != 3000 || c.Overridden[0].Summary.Max != 2900 || c.Overridden[0].Summary.Would429 != 1 {
		t.Errorf("cap %+v", c)
	}
	// Without a spec the bucket still names its budget (and a money
	// bucket its measure).
	r, err = Build(append(data, ledger.Data{Rule: ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-user#cost"}, Window: ledger.DayWindow(day), Usage: map[string]uint64{"u1": 5}}), Mapping{}, Options{Now: now, Days: 1})
	if err != nil || len(r.Budgets) != 1 || len(r.Budgets[0].Caps) != 2 || r.Budgets[0].Caps[1].Measure != MeasureCost {
		t.Fatalf("no spec: %v %+v", err, r)
	}
}

// everyWindow is a spec with a cap of every window and a money cap.
const everyWindow = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: s}
spec:
  gateways: [{namespace: edge, name: gw1}]
  identities: {x-user: {jwtClaim: sub}}
  pricing: {currency: EUR, models: [{model: "m", input: 1, output: 2}], default: {input: 15, output: 75}}
  budgets:
    - name: all
      perPrincipal: x-user
      shadowSince: SINCE
      limits: [{tokens: 100, per: hour}, {tokens: 1000, per: day}, {tokens: 5000, per: week}, {tokens: 6000000000, per: month}, {cost: 10, per: month}]
`

// TestEveryWindowJudgedOnItsOwn: each cap of a budget is judged on its own
// window: the hour cap on the hours of the report's days, the day cap on the
// days, the week on the last complete week, the month (a kilotoken rule,
// counted back in tokens) on the last complete month, money in money; and a
// month not yet measured in full on a projection, marked as such.
func TestEveryWindowJudgedOnItsOwn(t *testing.T) {
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC) // a Friday
	data := everyWindowData(now)
	checkEveryWindowJudged(t, buildSpec(t, strings.Replace(everyWindow, "SINCE", "2026-09-20", 1), data, now))
	checkProjectedMonth(t, buildSpec(t, strings.Replace(everyWindow, "SINCE", "2026-11-10", 1), data, now))
}

// everyWindowData: a week of hour and day rows (one hour over the hour
// cap), a week, and two months of kilotokens and money.
func everyWindowData(now time.Time) []ledger.Data {
	bucket := func(m string) ledger.RuleID { return ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/all" + m} }
	row := func(rule ledger.RuleID, w ledger.Window, u uint64) ledger.Data {
		return ledger.Data{Rule: rule, Window: w, Usage: map[string]uint64{"u1": u, "u2": 1}}
	}
	var data []ledger.Data
	for d := ledger.DayOf(now) - 7; d < ledger.DayOf(now); d++ {
		data = append(data, row(bucket(""), ledger.DayWindow(d), 900))
		for h := uint8(0); h < 24; h++ {
			u := uint64(40)
			if h == 3 && d == ledger.DayOf(now)-2 {
				u = 250 // one hour over the hour cap
			}
			data = append(data, row(bucket(""), ledger.Window{Period: ledger.PeriodHour, Day: d, Hour: h}, u))
		}
	}
	wk := ledger.WindowAt(ledger.PeriodWeek, now.AddDate(0, 0, -7), nil) // 2026-W46
	data = append(data, row(bucket(""), wk, 6300))
	oct := ledger.WindowAt(ledger.PeriodMonth, time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC), nil)
	nov := ledger.WindowAt(ledger.PeriodMonth, now, nil)
	return append(data, row(bucket("#ktokens"), oct, 5_000_000), row(bucket("#ktokens"), nov, 3_000_000),
		row(bucket("#cost"), oct, 80_000), row(bucket("#cost"), nov, 50_000))
}

// checkEveryWindowJudged: shadow since September, each cap on its window.
func checkEveryWindowJudged(t *testing.T, r *Report) {
	t.Helper()
	b := r.Budgets[0]
	want := map[string]string{
		"hour/tokens":  "168 hours of 7 days 2026-11-13..2026-11-19",
		"day/tokens":   "7 days 2026-11-13..2026-11-19",
		"week/tokens":  "week 2026-W46",
		"month/tokens": "month 2026-10",
		"month/cost":   "month 2026-10",
	}
	if len(b.Caps) != len(want) {
		t.Fatalf("caps %+v", b.Caps)
	}
	for _, c := range b.Caps {
		if w := want[c.Window+"/"+c.Measure]; c.Judged.Text != w {
			t.Errorf("%s/%s judged on %q, want %q", c.Window, c.Measure, c.Judged.Text, w)
		}
	}
	hour := capOf(t, b, "hour", MeasureTokens)
	if hour.Summary.PrincipalWindows != 336 || hour.Summary.OverCap != 1 || hour.OverCapPrincipals[0].WindowsOver[0] != "2026-11-18T03Z" || len(hour.PerDay) != 7 || hour.PerDay[5].OverCap != 1 {
		t.Errorf("hour cap %+v", hour.Summary)
	}
	if week := capOf(t, b, "week", MeasureTokens); week.Cap != 5000 || week.Summary.Max != 6300 || week.Summary.OverCap != 1 {
		t.Errorf("week cap %+v", week)
	}
	// The kilotoken month: 5,000,000 units of 1,000 tokens = 5e9 tokens, under the 6e9 cap.
	if month := capOf(t, b, "month", MeasureTokens); month.Cap != 6_000_000_000 || month.Summary.Max != 5_000_000_000 || month.Summary.OverCap != 0 {
		t.Errorf("month cap %+v", month)
	}
	// Money: EUR 8 of EUR 10 in October.
	if money := capOf(t, b, "month", MeasureCost); money.Currency != "EUR" || money.Cap != 100_000 || money.Summary.Max != 80_000 {
		t.Errorf("money cap %+v", money)
	}
}

// checkProjectedMonth: shadow since November 10: October was not measured in full, so the
// month is judged on November so far (the 11th to now, 9.5 of 30 days),
// projected.
func checkProjectedMonth(t *testing.T, r *Report) {
	t.Helper()
	month := capOf(t, r.Budgets[0], "month", MeasureCost)
	p := month.Judged.Projection
	if p == nil || p.Window != "2026-11" || p.ObservedHours != 228 || math.Abs(p.Factor-720.0/228) > 0.001 {
		t.Fatalf("projection %+v (%s)", p, month.Judged.Text)
	}
	// EUR 5 in 9.5 days projects to EUR 15.79 for the month: over the EUR 10 cap.
	if month.Summary.Max != 157_895 || month.Summary.OverCap != 1 || !strings.Contains(month.Judged.Text, "projection from 9.5 of 30 days measured (x3.16)") {
		t.Fatalf("projected month %+v %q", month.Summary, month.Judged.Text)
	}
	if v := month.Verdict; v.Status != VerdictNotYet || len(v.Notes) != 1 || !strings.Contains(v.Notes[0], "judged on a projection of 2026-11") {
		t.Fatalf("verdict %+v", v)
	}
	// W46 (from Monday the 9th) was measured from the 11th: 5 of its 7 days,
	// more than the running W47 has so far.
	if week := capOf(t, r.Budgets[0], "week", MeasureTokens); week.Judged.Projection == nil || week.Judged.Projection.Window != "2026-W46" ||
		week.Judged.Projection.ObservedHours != 120 || week.Summary.Max != 8820 {
		t.Fatalf("week %q %+v", week.Judged.Text, week.Summary)
	}
	var buf bytes.Buffer
	if err := WriteText(&buf, r); err != nil || !strings.Contains(buf.String(), "month (projected)") {
		t.Fatalf("text marks the projection: %v\n%s", err, buf.String())
	}
}

func buildSpec(t *testing.T, doc string, data []ledger.Data, now time.Time) *Report {
	t.Helper()
	bs, err := spec.Load([]byte(doc), "s.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := MappingFromSpec(bs)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Build(data, m, Options{Now: now, Days: 7})
	if err != nil {
		t.Fatal(err)
	}
	return r
}
