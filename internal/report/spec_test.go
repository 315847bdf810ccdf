package report

import (
	"os"
	"testing"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

func TestMappingFromExampleSpec(t *testing.T) {
	b, err := os.ReadFile("../../examples/budgets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bs, err := spec.Load(b, "budgets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := MappingFromSpec(bs)
	if err != nil {
		t.Fatal(err)
	}
	d := "ai-gateway/ai-budgets-agent-router"
	rule := func(i string) RuleInfo { return m.Rules[ledger.RuleID{Domain: d, Rule: d + "/rule/" + i}] }
	if r := rule("0"); r.Budget != "per-human" || r.Kind != budgetmap.KindTokens || r.Principal != "" || r.Measure != MeasureTokens || r.Scale != 1 {
		t.Fatalf("rule 0: %+v", r)
	}
	// per-human's unidentified requests (rule 1), per-api-key (rule 2) then
	// its overrides sorted by principal: acme-batch, trial-42, then its
	// unidentified requests (rule 5): principal budgetgen/no-claim, which is
	// no override, so the report counts it among the budget's principals.
	if r := rule("1"); r.Budget != "per-human" || r.Principal != agentgateway.NoClaim {
		t.Fatalf("rule 1: %+v", r)
	}
	if r := rule("2"); r.Budget != "per-api-key" || r.Principal != "" {
		t.Fatalf("rule 2: %+v", r)
	}
	if r := rule("3"); r.Budget != "per-api-key" || r.Principal != "acme-batch" {
		t.Fatalf("rule 3: %+v", r)
	}
	if r := rule("4"); r.Principal != "trial-42" {
		t.Fatalf("rule 4: %+v", r)
	}
	if r := rule("5"); r.Budget != "per-api-key" || r.Principal != agentgateway.NoClaim {
		t.Fatalf("rule 5: %+v", r)
	}
	if r := rule("6"); r.Budget != "frontier" {
		t.Fatalf("rule 6: %+v", r)
	}
	if r, ok := m.Rules[ledger.RuleID{Domain: d, Rule: d + "/rule/7"}]; ok {
		t.Fatalf("rule 7 exists (%+v): B1-B2 are not on Envoy Gateway", r)
	}
	// B1-B2 on agentgateway: rows named by the domain and the budget entry's
	// value (no budget map), and by the bucket (with one).
	agw := "agents/ai-budgets-agent-gateway"
	for _, b := range []string{"per-run", "agent-fleet"} {
		if r := m.Rules[ledger.RuleID{Domain: agw, Rule: b}]; r.Budget != b || r.Kind != budgetmap.KindTokens || r.Principal != "" {
			t.Fatalf("agentgateway rule %s: %+v", b, r)
		}
		if r := m.Rules[ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "ai-budgets/" + b}]; r.Budget != b {
			t.Fatalf("bucket of %s: %+v", b, r)
		}
	}
	day := CapKey{ledger.PeriodDay, MeasureTokens}
	if bi := m.Budgets["per-run"]; bi.Group || bi.Caps[day].Cap != 5000000 || bi.Mode != "shadow" || bi.ShadowSince != "2026-10-16" {
		t.Fatalf("per-run %+v", bi)
	}
	if bi := m.Budgets["agent-fleet"]; !bi.Group || bi.Caps[day].Cap != 200000000 || bi.Mode != "shadow" {
		t.Fatalf("agent-fleet %+v", bi)
	}
	if bi := m.Budgets["per-api-key"]; bi.Overrides["acme-batch"][day].Cap != 20000000 || bi.Caps[day].Cap != 1000000 {
		t.Fatalf("per-api-key %+v", bi)
	}
	if bi := m.Budgets["frontier"]; bi.Caps[day].Cap != 50000000 {
		t.Fatalf("frontier %+v", bi)
	}
}
