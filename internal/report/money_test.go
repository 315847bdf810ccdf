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

// TestMoneyBesideTokens: a daily cost limit is a cap of its own budget,
// whose cap and usage read in the currency, next to the token cap.
func TestMoneyBesideTokens(t *testing.T) {
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
	data := []ledger.Data{
		{Rule: ledger.RuleID{Domain: dom, Rule: dom + "/rule/0"}, Window: ledger.DayWindow(day), Usage: map[string]uint64{ledger.EncodePrincipal1("red"): 700_000}},
		{Rule: ledger.RuleID{Domain: dom, Rule: dom + "/rule/1"}, Window: ledger.DayWindow(day), Usage: map[string]uint64{ledger.EncodePrincipal1("red"): 123_456}}, // EUR 12.3456
	}
	r, err := Build(data, m, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Budgets) != 1 || r.Budgets[0].Name != "per-team" {
		t.Fatalf("budgets %+v, want per-team once", r.Budgets)
	}
	b := r.Budgets[0]
	money, tokens := capOf(t, b, "day", MeasureCost), capOf(t, b, "day", MeasureTokens)
	if money.Currency != "EUR" || money.Cap != 500_000 || money.Summary.Max != 123_456 || tokens.Summary.Max != 700_000 || tokens.Currency != "" {
		t.Fatalf("money %+v tokens %+v", money, tokens)
	}
	if d := b.Daily[6]; d.Tokens != 700_000 || d.Money != 123_456 || d.Currency != "EUR" {
		t.Fatalf("day totals %+v", d)
	}
	var buf bytes.Buffer
	if err := WriteText(&buf, r); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "cap EUR 50.0000 EUR per day") || !strings.Contains(out, "max EUR 12.3456") || !strings.Contains(out, "max 700,000") ||
		!strings.Contains(out, "2026-10-23 700,000 tokens (EUR 12.3456)") {
		t.Fatalf("text report does not show money beside tokens:\n%s", out)
	}
	for _, w := range []Writer{WriteMarkdown, WriteHTML} {
		buf.Reset()
		if err := w(&buf, r); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), "EUR 50.0000") || !strings.Contains(buf.String(), "EUR 12.3456") {
			t.Fatalf("report:\n%s", buf.String())
		}
	}
}
