package assert

// ruleConflict: Envoy Gateway attaches one policy of each kind per target -
// a Gateway, a Gateway listener, a route, a route rule. It orders policies by
// creationTimestamp, then namespace/name, keeps the first and marks every
// later one on the same target Accepted=False, reason Conflicted
// (internal/gatewayapi/resource/resource.go Resources.Sort;
// backendtrafficpolicy.go resolveBackendTrafficPolicyGatewayTargetRef and
// resolveBackendTrafficPolicyRouteTargetRef, securitypolicy.go
// resolveSecurityPolicyGatewayTargetRef and resolveSecurityPolicyRouteTargetRef,
// clienttrafficpolicy.go ProcessClientTrafficPolicies). A Conflicted
// BackendTrafficPolicy's budgets do nothing; a Conflicted SecurityPolicy sets
// no identity and a Conflicted ClientTrafficPolicy strips no header, whatever
// the rules that read them assume. The other rules use the policy EG keeps
// (Index.attachOf).
var ruleConflict = &Rule{
	ID:       "BG005",
	Name:     "one-policy-per-gateway",
	Doc:      "at most one BackendTrafficPolicy, SecurityPolicy and ClientTrafficPolicy targets each Gateway, listener, route and route rule (EG keeps the first and marks the others Conflicted)",
	Severity: Error,
	Check: func(p *Pass) error {
		for _, kind := range []string{kindBackendTrafficPolicy, kindSecurityPolicy, kindClientTrafficPolicy} {
			for _, c := range p.Index.attachOf(kind).conflicts {
				reportConflict(p, c)
			}
		}
		return nil
	},
}

// conflictFix says how to resolve a conflict, per kind.
var conflictFix = map[string]string{
	kindBackendTrafficPolicy: "merge them into one policy: give budgetgen the other policy as spec.gateways[].basePolicy and it renders one policy with both",
	kindSecurityPolicy:       "merge them into one SecurityPolicy (every credential and claimToHeaders in one), or attach one of them to a more specific target",
	kindClientTrafficPolicy:  "merge them into one ClientTrafficPolicy (headers.earlyRequestHeaders.remove with every identity header), or attach one to a listener (sectionName)",
}

func reportConflict(p *Pass, c conflict) {
	w, l := c.Winner, c.Loser
	if w.Policy == l.Policy {
		p.Report(l.Policy, l.Node, l.Path, "%s targets %s twice: EG marks the policy Conflicted", l.Policy, targetName(l))
		return
	}
	order := "the older by creationTimestamp"
	switch {
	case w.created.IsZero() || l.created.IsZero():
		order = "first by namespace/name here, as the manifests carry no creationTimestamp; on a cluster the older object wins"
	case w.created.Equal(l.created):
		order = "same creationTimestamp, first by namespace/name"
	}
	p.Report(l.Policy, l.Node, l.Path, "%s is already targeted by %s: EG accepts %s (%s) and marks %s Accepted=False, reason Conflicted; %s",
		targetName(l), w.Policy, w.Policy, order, l.Policy, conflictFix[l.Policy.Kind])
}

// targetName is the attachment's target as a reader names it.
func targetName(a *attachment) string { return a.Key }
