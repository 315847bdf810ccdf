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
func addBuckets(m *Mapping, bs *spec.BudgetSet) {
	for _, e := range render.BudgetMap(bs).Entries {
		if e.Kind != budgetmap.KindTokens {
			continue
		}
		m.Rules[ledger.RuleID{Domain: ledger.BudgetDomain, Rule: e.Bucket}] = RuleInfo{Budget: e.Budget, Kind: KindTokens}
	}
}
