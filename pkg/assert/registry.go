package assert

import "sort"

// rules is the registry, one entry per file bgNNN_*.go.
var rules = []*Rule{
	ruleShared,
	ruleShadow,
	ruleCost,
	ruleUnit,
	ruleConflict,
	ruleIdentity,
	ruleSchema,
	ruleDrift,
	ruleOverride,
	ruleVersion,
	ruleLimits,
	ruleRouteCoverage,
	ruleAgentgateway,
	ruleAICost,
	ruleOptionalCredential,
	ruleGatewayScope,
	ruleEffectiveBudget,
	ruleRouteIdentity,
	ruleTranslatorValid,
	ruleTokenCount,
	ruleAgentgatewayJWT,
	ruleFilterOrder,
	ruleRateLimitReach,
	rulePricedModel,
	ruleAgentgatewayIssuer,
	ruleAgentgatewayRouteType,
}

// Rules returns every registered rule in ID order.
func Rules() []*Rule {
	out := append([]*Rule(nil), rules...)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// IDs returns the registered rule IDs in order.
func IDs() []string {
	var ids []string
	for _, r := range Rules() {
		ids = append(ids, r.ID)
	}
	return ids
}

// Lookup returns the rule with id, or nil.
func Lookup(id string) *Rule {
	for _, r := range rules {
		if r.ID == id {
			return r
		}
	}
	return nil
}
