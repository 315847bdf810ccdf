package report

import (
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
	data := []ledger.DayData{{
		Rule: ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-user"}, Day: day,
		Usage: map[string]uint64{"u1": 1200, "vip": 2900},
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
}

// A budget whose caps are all per hour, week or month is enforced but never
// in the ledger (it measures day-window rules): the report says so for it
// instead of "no measurements in ...", and a budget with a day cap next to
// a month one is measured as before.
func TestReportSaysWhyABudgetWithoutDayCapIsNotMeasured(t *testing.T) {
	doc := `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: s}
spec:
  gateways: [{namespace: edge, name: gw1}]
  identities: {x-user: {jwtClaim: sub}}
  budgets:
    - {name: monthly, perPrincipal: x-user, limits: [{tokens: 30000, per: month}, {tokens: 5000, per: week}]}
    - {name: daily, perPrincipal: x-user, limits: [{tokens: 1000, per: day}, {tokens: 20000, per: month}]}
`
	bs, err := spec.Load([]byte(doc), "s.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := MappingFromSpec(bs)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Build(nil, m, Options{Now: time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC), Days: 7})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, b := range r.Budgets {
		got[b.Name] = b.NoData
	}
	if want := "not measured: the shadow-week ledger measures day caps, and monthly has caps per month and week only"; !strings.HasPrefix(got["monthly"], want) {
		t.Errorf("monthly: NoData %q, want it to start %q", got["monthly"], want)
	}
	if !strings.HasPrefix(got["daily"], "no measurements in ") {
		t.Errorf("daily (has a day cap): NoData %q, want the usual no-measurements reason", got["daily"])
	}
}
