package assert

import (
	"encoding/json"
	"regexp"

	"github.com/budgetgen/budgetgen/internal/aigateway"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// llmRequestCostsAnnotation is where budgetgen render lists the costs its
// rules need Envoy AI Gateway to compute (pkg/render AnnotationLLMRequestCosts).
const llmRequestCostsAnnotation = "budgetgen.dev/llm-request-costs"

// rulePricedModel: a money cap charges the cost Envoy AI Gateway computes
// with the CEL expression budgetgen renders from spec.pricing, and that
// expression prices the model in the x-ai-eg-model header, which AI Gateway
// overwrites with a backendRef's modelNameOverride before the cost is
// computed (internal/extproc/processor_impl.go). A backend whose overridden
// name no spec.pricing.models entry matches silently gets the default price,
// whatever model the client asked for: this rule names each such backendRef
// of an AIGatewayRoute attached to a Gateway with money caps.
var rulePricedModel = &Rule{
	ID:       "BG037",
	Name:     "priced-model-override",
	Doc:      "every modelNameOverride of an AIGatewayRoute on a Gateway with money caps is matched by a spec.pricing.models entry (AI Gateway prices the overridden name)",
	Severity: Warning,
	Check: func(p *Pass) error {
		routes := map[GatewayKey][]*aigateway.Route{}
		for _, rt := range p.Index.aiRoutes {
			for _, pr := range rt.Parents {
				routes[GatewayKey{pr.Namespace, pr.Name, ""}] = append(routes[GatewayKey{pr.Namespace, pr.Name, ""}], rt)
			}
		}
		reported := map[*aigateway.ModelOverride]bool{}
		for _, pol := range p.Index.BudgetPolicies() {
			patterns, ok := pricedModels(pol)
			if !ok {
				continue
			}
			for _, t := range p.Index.Targets(pol.Obj) {
				for _, rt := range routes[GatewayKey{t.Gateway.Namespace, t.Gateway.Name, ""}] {
					for i := range rt.Overrides {
						ov := &rt.Overrides[i]
						if reported[ov] || matchesAny(patterns, ov.Model) {
							continue
						}
						reported[ov] = true
						p.Report(rt.Obj, ov.Node, ov.Path, "backend %s gets model %q (modelNameOverride), the name Envoy AI Gateway prices (x-ai-eg-model), and no spec.pricing.models entry of %s matches it: every request routed there is charged spec.pricing.default, whatever model was asked for; add an entry for %q",
							ov.Backend, ov.Model, pol.Obj, ov.Model)
					}
				}
			}
		}
		return nil
	},
}

// pricedModels reads the models a budget policy's money cost expression
// prices (its llm-request-costs annotation); ok is false without one.
func pricedModels(pol *Policy) ([]*regexp.Regexp, bool) {
	raw := manifest.Str(manifest.Get(pol.Obj.Node, "metadata", "annotations", llmRequestCostsAnnotation))
	if raw == "" {
		return nil, false
	}
	var costs []aigateway.LLMRequestCost
	if err := json.Unmarshal([]byte(raw), &costs); err != nil {
		return nil, false // BG003 and BG013 speak of malformed cost annotations
	}
	for _, c := range costs {
		if c.MetadataKey != costMetadataKey || c.CEL == "" {
			continue
		}
		pats, ok := aigateway.ModelPatterns(c.CEL)
		if !ok {
			return nil, false
		}
		var out []*regexp.Regexp
		for _, s := range pats {
			re, err := regexp.Compile(s)
			if err != nil {
				return nil, false
			}
			out = append(out, re)
		}
		return out, true
	}
	return nil, false
}

func matchesAny(res []*regexp.Regexp, s string) bool {
	for _, re := range res {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}
