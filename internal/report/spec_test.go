package report

import (
	"os"
	"testing"

	"github.com/budgetgen/budgetgen/internal/ledger"
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
	if r := rule("0"); r.Budget != "per-run" || r.Cap != 5000000 || r.Kind != KindTokens || r.Principal != "" {
		t.Fatalf("rule 0: %+v", r)
	}
	// per-api-key (rule 3) then its overrides sorted by principal: acme-batch, trial-42.
	if r := rule("4"); r.Budget != "per-api-key" || r.Principal != "acme-batch" || r.Cap != 20000000 {
		t.Fatalf("rule 4: %+v", r)
	}
	if r := rule("5"); r.Principal != "trial-42" || r.Cap != 100000 {
		t.Fatalf("rule 5: %+v", r)
	}
	if r := rule("6"); r.Budget != "frontier" || r.Cap != 50000000 {
		t.Fatalf("rule 6: %+v", r)
	}
	if bi := m.Budgets["agent-fleet"]; !bi.Group || bi.Cap != 200000000 || bi.Mode != "shadow" {
		t.Fatalf("agent-fleet %+v", bi)
	}
	if bi := m.Budgets["per-api-key"]; bi.Overrides["acme-batch"] != 20000000 {
		t.Fatalf("per-api-key %+v", bi)
	}
}
