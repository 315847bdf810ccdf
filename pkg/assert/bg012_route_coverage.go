package assert

import (
	"fmt"
	"sort"
	"strings"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleRouteCoverage: BG006 accepts identity headers set by SecurityPolicies
// on a Gateway's routes rather than on the Gateway, since different routes
// often authenticate different principals (JWT for agents and humans, API
// keys for clients) and nothing is spoofed on a route without one. But a
// route with no SecurityPolicy setting any of the headers a budget policy
// selects on carries none of them: its requests match no per-principal rule
// and are charged to no principal's budget - an escape from every cap but
// the group and model ones, created by adding a route. This rule names such
// routes among those in the input attached to the budget policy's Gateway,
// when no policy on the Gateway itself sets one of the headers (HTTPRoutes,
// GRPCRoutes and Envoy AI Gateway's AIGatewayRoutes). A warning:
// some routes are meant to be free (health checks, internal tools).
var ruleRouteCoverage = &Rule{
	ID:       "BG012",
	Name:     "route-coverage",
	Doc:      "when identity headers are set by route-level SecurityPolicies only, every route attached to the Gateway sets at least one of the headers the budgets select on",
	Severity: Warning,
	Check: func(p *Pass) error {
		whole := map[GatewayKey]map[string]bool{}   // gateway -> headers set on it
		byRoute := map[GatewayKey]map[string]bool{} // route (as a key) -> headers set on it
		for _, sp := range p.Index.SecurityPolicies {
			hs := credentialHeaders(sp)
			for _, t := range p.Index.Targets(sp) {
				if t.Via == "" {
					addAll(whole, GatewayKey{t.Gateway.Namespace, t.Gateway.Name, ""}, hs)
				} else {
					addAll(byRoute, GatewayKey{Name: t.Via}, hs)
				}
			}
		}
		attached := map[GatewayKey][]string{} // gateway -> routes in the input
		for _, rt := range p.Index.Routes {
			for _, gk := range routeParents(rt) {
				attached[gk] = append(attached[gk], rt.Namespace+"/"+rt.Name)
			}
		}
		// An AIGatewayRoute is the route of LLM traffic in a GitOps repo:
		// Envoy AI Gateway generates the HTTPRoute of the same name in the
		// cluster, and SecurityPolicies target that (Targets resolves it).
		for _, ar := range p.Index.aiRoutes {
			for _, pr := range ar.Parents {
				gk := GatewayKey{Namespace: pr.Namespace, Name: pr.Name}
				attached[gk] = append(attached[gk], ar.Obj.Namespace+"/"+ar.Obj.Name)
			}
		}
		// Routes whose SecurityPolicy authenticates are BG031's: it reports
		// a credential that sets none of the headers as an error.
		authenticated := authenticatedRoutes(p.Index)
		model := strings.ToLower(p.Options.modelHeader())
		for _, pol := range p.Index.BudgetPolicies() {
			var headers []string
			first := map[string]HeaderMatch{}
			for _, r := range pol.Rules {
				for _, hm := range r.Headers() {
					if _, ok := first[hm.Name]; !ok && hm.Name != model {
						first[hm.Name] = hm
						headers = append(headers, hm.Name)
					}
				}
			}
			if len(headers) == 0 {
				continue
			}
			any := func(set map[string]bool) bool {
				for _, h := range headers {
					if set[h] {
						return true
					}
				}
				return false
			}
			var missing []string
			for _, t := range p.Index.Targets(pol.Obj) {
				gk := GatewayKey{t.Gateway.Namespace, t.Gateway.Name, ""}
				if any(whole[gk]) {
					continue // every route gets a header from the Gateway's policy
				}
				for _, rt := range attached[gk] {
					if !any(byRoute[GatewayKey{Name: rt}]) && !authenticated[rt] {
						missing = append(missing, rt)
					}
				}
			}
			if len(missing) == 0 {
				continue
			}
			sort.Strings(headers)
			hm := first[headers[0]]
			p.Report(pol.Obj, manifest.Get(hm.Node, "name"), hm.Path+".name", "routes %s attached to the Gateway have no SecurityPolicy setting any identity header the budgets select on (%s): their requests are charged to no principal's budget%s; add them to a SecurityPolicy, or set the headers on the Gateway", strings.Join(dedupe(missing), ", "), strings.Join(headers, ", "), sharedUnidentified(pol))
		}
		return nil
	},
}

// authenticatedRoutes names (namespace/name) the routes on which the
// SecurityPolicy EG applies authenticates requests.
func authenticatedRoutes(ix *Index) map[string]bool {
	out := map[string]bool{}
	sps := ix.attachOf(kindSecurityPolicy)
	for _, u := range ix.allUnits() {
		eff, parent := sps.effective(u)
		if eff == nil || out[u.Route.ID()] {
			continue
		}
		if spec, owner, err := ix.effectiveSecurity(eff, parent); err == nil && len(credentials(spec, owner)) > 0 {
			out[u.Route.ID()] = true
		}
	}
	return out
}

// sharedUnidentified is what a finding about requests carrying no identity
// header adds for a budget policy that has rules for them (rule-budgets
// principal budgetgen/no-claim, which budgetgen renders on Envoy Gateway):
// such requests are not free there, but share one bucket per budget.
func sharedUnidentified(pol *Policy) string {
	for _, r := range pol.Rules {
		if r.Principal == agentgateway.NoClaim {
			return fmt.Sprintf(" (they share each per-principal budget's one %s bucket with every other request carrying none of the identity headers)", agentgateway.NoClaim)
		}
	}
	return ""
}
