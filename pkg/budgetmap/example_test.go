package budgetmap_test

import (
	"bytes"
	"fmt"

	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// A rate limit service finds which budget a configured limit implements: the
// same budget on an Envoy Gateway Gateway (a rule descriptor) and on an
// agentgateway Gateway (budget, then principal) is one bucket, so a
// principal's counter is shared.
func Example() {
	src := []byte(`apiVersion: budgetgen.dev/v1alpha1
kind: BudgetMap
budgetSet: ai-budgets
entries:
  - domain: ai-gateway/ai-budgets-agent-router
    descriptor:
      - {key: ai-gateway/ai-budgets-agent-router/rule/0, value: ai-gateway/ai-budgets-agent-router/rule/0}
    gateway: {kind: envoy, namespace: ai-gateway, name: agent-router}
    budget: per-human
    bucket: ai-budgets/per-human
    kind: tokens
    principal: {header: x-ar-human}
    tokensPerDay: 2000000
    window: day
    mode: enforce
  - domain: agents/ai-budgets-agent-gateway
    descriptor:
      - {key: budget, value: per-human}
      - {key: principal}
    gateway: {kind: agentgateway, namespace: agents, name: agent-gateway}
    budget: per-human
    bucket: ai-budgets/per-human
    kind: tokens
    principal: {expression: 'coalesce(string(jwt["sub"]), "budgetgen/no-claim")'}
    tokensPerDay: 2000000
    window: day
    mode: enforce
`)
	m, err := budgetmap.Load(src, "budget-map.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	ix := budgetmap.NewIndex(m)
	rule := budgetmap.RuleDescriptor("ai-gateway/ai-budgets-agent-router", 0)
	limits := []struct {
		domain string
		path   []budgetmap.DescriptorEntry
	}{
		{"ai-gateway/ai-budgets-agent-router", []budgetmap.DescriptorEntry{{Key: rule, Value: rule}, {Key: "rule-0-match-0"}}},
		{"agents/ai-budgets-agent-gateway", []budgetmap.DescriptorEntry{{Key: "budget", Value: "per-human"}, {Key: "principal"}}},
		{"agents/ai-budgets-agent-gateway", []budgetmap.DescriptorEntry{{Key: "budget", Value: "per-run"}, {Key: "principal"}}},
	}
	for _, l := range limits {
		if e := ix.Lookup(l.domain, l.path); e != nil {
			fmt.Printf("%s %s: budget %s, bucket %s, %d tokens a %s, %s\n", e.Gateway.Kind, l.domain, e.Budget, e.Bucket, e.TokensPerDay, e.Window, e.Mode)
		} else {
			fmt.Printf("%s: no budget %s\n", l.domain, l.path[0].Value)
		}
	}

	// A map that does not load says where.
	_, err = budgetmap.Load(bytes.Replace(src, []byte("mode: enforce"), []byte("mode: enforced"), 1), "budget-map.yaml")
	fmt.Println(err)
	// Output:
	// envoy ai-gateway/ai-budgets-agent-router: budget per-human, bucket ai-budgets/per-human, 2000000 tokens a day, enforce
	// agentgateway agents/ai-budgets-agent-gateway: budget per-human, bucket ai-budgets/per-human, 2000000 tokens a day, enforce
	// agents/ai-budgets-agent-gateway: no budget per-run
	// budget-map.yaml:15: entries[0].mode: must be shadow or enforce, got "enforced"
}
