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

// agentgatewayRemoteRateLimits lists the AgentgatewayPolicies that set a
// remote rate limit: rateLimit.global, or a global in any of
// rateLimit.conditional[].policy (the controller turns those into one remote
// rate limit policy with conditions: processConditionalEntries in
// controller/pkg/agentgateway/plugins/traffic_plugin.go). agentgateway keeps
// one remote rate limit per request, the most specific target's
// (crates/agentgateway/src/store/binds.rs route_policies), so either form on
// a route replaces a Gateway's budgets there, a conditional one even on the
// requests none of its conditions match.
func agentgatewayRemoteRateLimits(ix *Index) []*manifest.Object {
	var out []*manifest.Object
	for _, o := range ix.Objects {
		if o.Kind != agentgateway.KindPolicy || o.Group() != agentgateway.Group {
			continue
		}
		if manifest.Get(o.Node, "spec", "traffic", "rateLimit", "global") != nil || conditionalGlobal(o) {
			out = append(out, o)
		}
	}
	return out
}

// conditionalGlobal reports whether an AgentgatewayPolicy sets a global rate
// limit in one of its rateLimit.conditional[].policy entries.
func conditionalGlobal(o *manifest.Object) bool {
	for _, c := range manifest.Items(manifest.Get(o.Node, "spec", "traffic", "rateLimit", "conditional")) {
		if manifest.Get(c, "policy", "global") != nil {
			return true
		}
	}
	return false
}
