package report

import (
	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// addBuckets maps the ledger rows a service with the budget map records
// (domain "budget", rule = the bucket) to their budgets, so a budget counted
// once across Gateways is reported once. The cap is left 0: the budget's cap
// or the principal's override applies, as for any default rule.
//
// Without a budget map, the service names an agentgateway descriptor's rows
// by its domain and its first entry's value, the budget's name (the config
// fixes it: `key: budget, value: <budget>`), so those rows map to the budget
// too. An override shares that rule (its principal is a sibling value under
// the same budget entry), so the cap is left 0 here too: the budget's cap or
// the principal's override applies.
func addBuckets(m *Mapping, bs *spec.BudgetSet) {
	for _, e := range render.BudgetMap(bs).Entries {
		if e.Kind != budgetmap.KindTokens {
			continue
		}
		m.Rules[ledger.RuleID{Domain: ledger.BudgetDomain, Rule: e.Bucket}] = RuleInfo{Budget: e.Budget, Kind: KindTokens}
		if e.Gateway.Kind == budgetmap.GatewayAgentgateway && e.OverridePrincipal == "" && len(e.Descriptor) > 0 {
			m.Rules[ledger.RuleID{Domain: e.Domain, Rule: e.Descriptor[0].Value}] = RuleInfo{Budget: e.Budget, Kind: KindTokens}
		}
	}
}
