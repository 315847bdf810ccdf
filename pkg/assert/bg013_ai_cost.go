package assert

import (
	"fmt"
	"sort"
	"strings"

	"github.com/budgetgen/budgetgen/internal/aigateway"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleAICost: since Envoy AI Gateway v1.0, llmRequestCosts are route-scoped.
// The AI Gateway filter writes io.envoy.ai_gateway:<key> for a request only
// when its AIGatewayRoute lists the key in spec.llmRequestCosts, or else when
// the Gateway's GatewayConfig (annotation aigateway.envoyproxy.io/gateway-config,
// same namespace) lists it in spec.globalLLMRequestCosts. Otherwise the
// response cost is 0 and the budget never fills, though every other check
// passes. This rule checks each AIGatewayRoute in the input attached to a
// budgeted Gateway against the keys the budget policy's token rules charge.
// With no AIGatewayRoute in the input for a budgeted Gateway it says once, as
// a warning, that the binding could not be checked.
var ruleAICost = &Rule{
	ID:       "BG013",
	Name:     "ai-cost-binding",
	Doc:      "every AIGatewayRoute attached to a budgeted Gateway writes the token metadata keys the budgets charge (route llmRequestCosts or the Gateway's GatewayConfig)",
	Severity: Error,
	Check: func(p *Pass) error {
		gateways := map[GatewayKey]*manifest.Object{}
		for _, gw := range p.Index.Gateways {
			gateways[GatewayKey{gw.Namespace, gw.Name, ""}] = gw
		}
		configs := map[GatewayKey]*aigateway.GatewayConfig{} // namespace/name
		for _, gc := range p.Index.aiConfigs {
			configs[GatewayKey{gc.Obj.Namespace, gc.Obj.Name, ""}] = gc
		}
		routes := map[GatewayKey][]*aigateway.Route{}
		for _, rt := range p.Index.aiRoutes {
			for _, pr := range rt.Parents {
				gk := GatewayKey{pr.Namespace, pr.Name, ""}
				if n := len(routes[gk]); n == 0 || routes[gk][n-1] != rt {
					routes[gk] = append(routes[gk], rt)
				}
			}
		}
		reported := map[string]bool{} // route + key, or policy + gateway for the warning
		for _, pol := range p.Index.BudgetPolicies() {
			keys := map[string]*RateRule{} // key -> first rule charging it
			var order []string
			for _, r := range pol.Rules {
				md := manifest.Get(r.Node, "cost", "response", "metadata")
				if r.Kind != TokenRule || manifest.Str(manifest.Get(r.Node, "cost", "response", "from")) != "Metadata" ||
					manifest.Str(manifest.Get(md, "namespace")) != aigateway.MetadataNamespace {
					continue // only the AI Gateway filter's namespace is ours to check (BG003 checks the rest)
				}
				key := manifest.Str(manifest.Get(md, "key"))
				if _, ok := keys[key]; !ok && key != "" {
					keys[key] = r
					order = append(order, key)
				}
			}
			if len(order) == 0 {
				continue
			}
			sort.Strings(order)
			for _, t := range p.Index.Targets(pol.Obj) {
				gk := GatewayKey{t.Gateway.Namespace, t.Gateway.Name, ""}
				attached := routes[gk]
				if len(attached) == 0 {
					id := pol.Obj.String() + "|" + gk.String()
					if !reported[id] {
						reported[id] = true
						p.ReportSeverity(Warning, pol.Obj, t.Node, t.Path, "no AIGatewayRoute in the input is attached to %s: cannot check that Envoy AI Gateway writes %s for its routes (a route that does not is charged 0 tokens); pass the AIGatewayRoutes and the GatewayConfig to the gate", gk, metaKeys(order))
					}
					continue
				}
				global, why := gatewayConfig(gateways, configs, gk)
				for _, rt := range attached {
					for _, key := range order {
						if rt.Writes(key) || global != nil && global.Writes(key) {
							continue
						}
						id := rt.Obj.String() + "|" + key
						if reported[id] {
							continue
						}
						reported[id] = true
						r := keys[key]
						// At the key: a block list's own node starts at its first item.
						at, path := manifest.Key(manifest.Get(rt.Obj.Node, "spec"), "llmRequestCosts"), "spec.llmRequestCosts"
						if at == nil {
							at, path = manifest.Key(rt.Obj.Node, "spec"), "spec"
						}
						p.Report(rt.Obj, at, path, "%s (attached to %s) does not write %s:%s, which %s rule %d charges%s%s: its responses are charged 0 tokens and the budget never fills; add {metadataKey: %s, type: %s} to this route's spec.llmRequestCosts, or to spec.globalLLMRequestCosts of the Gateway's GatewayConfig (annotation %s; budgetgen renders one with spec.gateways[].gatewayConfig)",
							rt.Obj, gk, aigateway.MetadataNamespace, key, pol.Obj, r.Index, writesOther(rt.Costs), why, key, costType(key), aigateway.GatewayConfigAnnotation)
					}
				}
			}
		}
		return nil
	},
}

// gatewayConfig finds the GatewayConfig of gateway gk, or says why there is none.
func gatewayConfig(gateways map[GatewayKey]*manifest.Object, configs map[GatewayKey]*aigateway.GatewayConfig, gk GatewayKey) (*aigateway.GatewayConfig, string) {
	gw, ok := gateways[gk]
	if !ok {
		return nil, fmt.Sprintf(" (the %s is not in the input, so its GatewayConfig is unknown)", gk)
	}
	name := aigateway.GatewayConfigName(gw)
	if name == "" {
		return nil, fmt.Sprintf(" (the Gateway has no %s annotation)", aigateway.GatewayConfigAnnotation)
	}
	gc, ok := configs[GatewayKey{gk.Namespace, name, ""}]
	if !ok {
		return nil, fmt.Sprintf(" (its GatewayConfig %s/%s is not in the input)", gk.Namespace, name)
	}
	return gc, fmt.Sprintf(" (nor does its GatewayConfig %s/%s)", gk.Namespace, name)
}

func writesOther(cs []aigateway.Cost) string {
	if len(cs) == 0 {
		return ""
	}
	keys := make([]string, 0, len(cs))
	for _, c := range cs {
		keys = append(keys, c.Key)
	}
	return " (it writes " + strings.Join(keys, ", ") + " only)"
}

// costType suggests the LLMRequestCost type for a well-known key.
func costType(key string) string {
	switch key {
	case "llm_input_token":
		return aigateway.CostInputToken
	case "llm_output_token":
		return aigateway.CostOutputToken
	case "llm_cached_input_token":
		return aigateway.CostCachedInputToken
	case "llm_cache_creation_input_token":
		return aigateway.CostCacheCreationInputToken
	case "llm_reasoning_token":
		return aigateway.CostReasoningToken
	}
	return aigateway.CostTotalToken
}

func metaKeys(keys []string) string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = aigateway.MetadataNamespace + ":" + k
	}
	return strings.Join(out, ", ")
}
