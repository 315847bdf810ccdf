package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

const moneySpec = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: spend}
spec:
  gateways: [{namespace: ai-gateway, name: agent-router}]
  identities:
    x-team: {extAuth: true}
  pricing:
    currency: EUR
    models: [{model: "gpt-5.*", input: 1.25, output: 10}]
    default: {input: 15, output: 75}
  budgets:
    - name: per-team
      perPrincipal: x-team
      limits: [{tokens: 1000000, per: day}, {cost: 50, per: day}]
`

// TestMoneyBudgetInMoney: a daily cost limit is reported as a budget of its
// own whose cap and usage read in the currency, apart from the token rule.
func TestMoneyBudgetInMoney(t *testing.T) {
	bs, err := spec.Load([]byte(moneySpec), "spend.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := MappingFromSpec(bs)
	if err != nil {
		t.Fatal(err)
	}
	dom := "ai-gateway/spend-agent-router"
	day := ledger.DayOf(now) - 1
	data := []ledger.DayData{
		{Rule: ledger.RuleID{Domain: dom, Rule: dom + "/rule/0"}, Day: day, Usage: map[string]uint64{ledger.EncodePrincipal1("red"): 700_000}},
		{Rule: ledger.RuleID{Domain: dom, Rule: dom + "/rule/1"}, Day: day, Usage: map[string]uint64{ledger.EncodePrincipal1("red"): 123_456}}, // EUR 12.3456
	}
	r, err := Build(data, m, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	var money, tokens *Budget
	for i := range r.Budgets {
		switch r.Budgets[i].Name {
		case "per-team (EUR)":
			money = &r.Budgets[i]
		case "per-team":
			tokens = &r.Budgets[i]
		}
	}
	if money == nil || tokens == nil {
		t.Fatalf("budgets %+v, want per-team and per-team (EUR)", r.Budgets)
	}
	if money.Currency != "EUR" || money.Cap != 500_000 || money.Summary.Max != 123_456 || tokens.Summary.Max != 700_000 || tokens.Currency != "" {
		t.Fatalf("money %+v tokens %+v", money, tokens)
	}
	var buf bytes.Buffer
	if err := WriteText(&buf, r); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "cap EUR 50.0000/day") || !strings.Contains(out, "max EUR 12.3456") || !strings.Contains(out, "max 700,000") {
		t.Fatalf("text report does not show money in money:\n%s", out)
	}
	buf.Reset()
	if err := WriteMarkdown(&buf, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "EUR 50.0000") {
		t.Fatalf("markdown report:\n%s", buf.String())
	}
}
