package assert

import (
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleAgentgatewayIssuer: agentgateway accepts a token from any provider of
// a jwtAuthentication and puts its claims in the CEL variable jwt
// (crates/agentgateway/src/http/jwt.rs: validate_claims looks the key up by
// kid across every provider and checks iss against that provider's issuer
// only), and a route's, listener's or ListenerSet's jwtAuthentication
// replaces the Gateway's on its traffic (crates/agentgateway/src/store/binds.rs,
// route_policies). Budget descriptors key on claim values alone, so every
// issuer whose tokens reach the budgets' traffic picks principals in one
// namespace: an issuer a tenant or a partner controls mints another issuer's
// user's value (their budget) or a new value per token (a fresh bucket each
// time). The rule reports each provider, on a policy that reaches a budget
// policy's Gateway or its routes, whose issuer is not the budgets' issuer:
// the first issuer of a Gateway-level jwtAuthentication, else the first seen.
var ruleAgentgatewayIssuer = &Rule{
	ID:       "BG038",
	Name:     "agentgateway-issuer",
	Doc:      "the jwtAuthentication policies on an agentgateway budget policy's traffic trust one issuer, so no other issuer can choose the claims the budgets key on",
	Severity: Error,
	Check: func(p *Pass) error {
		reported := map[*yaml.Node]bool{}
		for _, b := range agentgatewayBudgetPolicies(p.Index) {
			claims := budgetClaims(b)
			if len(claims) == 0 {
				continue
			}
			provs := issuersOn(p.Index, b)
			if len(provs) == 0 {
				continue
			}
			anchor := provs[0]
			for _, pv := range provs[1:] {
				if pv.issuer == anchor.issuer || reported[pv.node] {
					continue
				}
				reported[pv.node] = true
				p.Report(pv.policy, pv.node, pv.path, "issuer %q is trusted on the traffic of %s next to %q (%s): agentgateway puts the claims of a token from any provider in jwt (crates/agentgateway/src/http/jwt.rs, validate_claims), and the budgets key on %s alone, so this issuer chooses those principals: another issuer's user's value spends their budget, a new value per token is a fresh bucket each time; trust one issuer on budgeted traffic (move this route or listener to a Gateway without budgets), or --skip BG038 if every issuer is yours and their values cannot collide",
					pv.issuer, b, anchor.issuer, anchor.policy, strings.Join(claims, ", "))
			}
		}
		return nil
	},
}

// issuerAt is one jwtAuthentication provider's issuer.
type issuerAt struct {
	issuer string
	policy *manifest.Object
	node   *yaml.Node
	path   string
}

// issuersOn lists the providers of the jwtAuthentication policies that reach
// budget policy b's traffic, those of policies targeting a Gateway first.
// A policy on the whole Gateway with spec.strategy.inheritance: Override
// locks the field for more specific targets (merge_with_inheritance in
// crates/agentgateway/src/store/policy.rs): their providers are then left
// out, except those of PreRouting policies, a phase of its own that also
// verifies tokens and sets jwt (apply_gateway_policies in
// crates/agentgateway/src/proxy/httpproxy.rs).
func issuersOn(ix *Index, b *manifest.Object) []issuerAt {
	pols := jwtPoliciesFor(ix, b)
	gws := agwGatewayTargets(ix, b)
	wholeGateway := func(o *manifest.Object) bool {
		return slices.ContainsFunc(agwGatewayTargets(ix, o), func(g GatewayKey) bool {
			return g.Section == "" && sameGateway([]GatewayKey{g}, gws)
		})
	}
	preRouting := func(o *manifest.Object) bool {
		return manifest.Str(manifest.Get(o.Node, "spec", "traffic", "phase")) == "PreRouting"
	}
	if slices.ContainsFunc(pols, func(o *manifest.Object) bool {
		return wholeGateway(o) && !preRouting(o) && manifest.Str(manifest.Get(o.Node, "spec", "strategy", "inheritance")) == "Override"
	}) {
		pols = slices.DeleteFunc(pols, func(o *manifest.Object) bool { return !wholeGateway(o) && !preRouting(o) })
	}
	slices.SortStableFunc(pols, func(x, y *manifest.Object) int {
		return boolRank(len(agwGatewayTargets(ix, y)) > 0) - boolRank(len(agwGatewayTargets(ix, x)) > 0)
	})
	var out []issuerAt
	for _, o := range pols {
		for i, pr := range manifest.Items(manifest.Get(o.Node, "spec", "traffic", "jwtAuthentication", "providers")) {
			n := manifest.Get(pr, "issuer")
			if n == nil {
				n = pr
			}
			out = append(out, issuerAt{issuer: manifest.Str(n), policy: o, node: n,
				path: fmt.Sprintf("spec.traffic.jwtAuthentication.providers[%d].issuer", i)})
		}
	}
	return out
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// budgetClaims lists the JWT claims the descriptor entries of b read, sorted.
func budgetClaims(b *manifest.Object) []string {
	seen := map[string]bool{}
	for _, d := range manifest.Items(manifest.Get(b.Node, "spec", "traffic", "rateLimit", "global", "descriptors")) {
		for _, e := range manifest.Items(manifest.Get(d, "entries")) {
			cs, _ := agentgateway.Claims(manifest.Str(manifest.Get(e, "expression")))
			for _, c := range cs {
				seen[c] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}
