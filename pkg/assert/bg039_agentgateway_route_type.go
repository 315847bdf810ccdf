package assert

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
)

// ruleAgentgatewayRouteType: agentgateway picks an AI backend's route type
// from the request path (resolve_route in
// crates/agentgateway/src/llm/policy/mod.rs: the longest path suffix of
// ai.routes the path ends with, else the "*" entry, else Completions) and, for
// Passthrough and Realtime, applies no LLM request policy: no token rate limit
// is checked and no usage is amended (make_backend_call in
// crates/agentgateway/src/proxy/httpproxy.rs). The client chooses the path, so
// an ai.routes entry of either type on a budgeted Gateway lets it spend
// tokens no budget counts. The gate does not model which backends a
// Gateway's routes reach, so while the input holds agentgateway budgets it
// reports every such entry of an AgentgatewayBackend or AgentgatewayPolicy.
var ruleAgentgatewayRouteType = &Rule{
	ID:       "BG039",
	Name:     "agentgateway-route-type",
	Doc:      "no AI route type agentgateway charges to no budget (Passthrough, Realtime) in ai.routes while agentgateway budgets are in the input",
	Severity: Error,
	Check: func(p *Pass) error {
		if len(agentgatewayBudgetPolicies(p.Index)) == 0 {
			return nil
		}
		for _, o := range p.Index.Objects {
			if o.Group() != agentgateway.Group || (o.Kind != "AgentgatewayBackend" && o.Kind != agentgateway.KindPolicy) {
				continue
			}
			aiRoutes(o.Node, "", func(routes *yaml.Node, path string) {
				for i := 0; i+1 < len(routes.Content); i += 2 {
					k, v := routes.Content[i], routes.Content[i+1]
					if v.Value != "Passthrough" && v.Value != "Realtime" {
						continue
					}
					p.Report(o, v, fmt.Sprintf("%s[%q]", path, k.Value), "requests whose path matches %q are %s: agentgateway applies no LLM policy to them, so no budget checks or charges their tokens (make_backend_call in crates/agentgateway/src/proxy/httpproxy.rs), and the client chooses the path (resolve_route in crates/agentgateway/src/llm/policy/mod.rs); map the paths to a type agentgateway counts (Completions, Messages, Responses), or serve them from a Gateway without budgets",
						k.Value, v.Value)
				}
			})
		}
		return nil
	},
}

// aiRoutes calls fn with every ai.routes mapping under n (an AgentgatewayPolicy's
// spec.backend.ai, an AgentgatewayBackend's spec.policies.ai or a provider's
// policies.ai) and its path.
func aiRoutes(n *yaml.Node, path string, fn func(routes *yaml.Node, path string)) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			aiRoutes(c, path, fn)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i].Value, n.Content[i+1]
			kp := strings.TrimPrefix(path+"."+k, ".")
			if k == "routes" && strings.HasSuffix(path, "ai") && v.Kind == yaml.MappingNode {
				fn(v, kp)
				continue
			}
			aiRoutes(v, kp, fn)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			aiRoutes(c, fmt.Sprintf("%s[%d]", path, i), fn)
		}
	}
}
