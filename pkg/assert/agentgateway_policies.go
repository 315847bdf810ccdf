package assert

import (
	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// agentgatewayBudgetPolicies lists the AgentgatewayPolicies whose global rate
// limit enforces budgets (rule BG020 checks them): an install whose budgets
// all run on agentgateway holds no BackendTrafficPolicy, and the gate must
// not read that as an empty input.
func agentgatewayBudgetPolicies(ix *Index) []*manifest.Object {
	var out []*manifest.Object
	for _, o := range ix.Objects {
		if o.Kind == agentgateway.KindPolicy && o.Group() == agentgateway.Group &&
			manifest.Get(o.Node, "spec", "traffic", "rateLimit", "global") != nil {
			out = append(out, o)
		}
	}
	return out
}
