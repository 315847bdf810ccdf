package assert

import (
	"strings"

	"github.com/budgetgen/budgetgen/internal/manifest"
)

// ruleGatewayScope: a budget is one bucket per principal across every route
// the principal can reach. A budget policy attached to HTTPRoutes/GRPCRoutes
// (targetRefs or targetSelectors) rather than the Gateway leaves the
// Gateway's other routes unbudgeted: a principal sends its requests there.
// And a targetSelector that is not a valid label selector (an unknown
// operator) selects nothing, so whatever it was meant to reach is not covered;
// EG refuses it the same way.
var ruleGatewayScope = &Rule{
	ID:       "BG015",
	Name:     "gateway-scope",
	Doc:      "a budget policy attached to routes covers every route of their Gateway; targetSelectors are valid label selectors",
	Severity: Error,
	Check: func(p *Pass) error {
		for _, pol := range p.Index.BudgetPolicies() {
			targets := p.Index.Targets(pol.Obj)
			direct := map[GatewayKey]bool{}
			for _, t := range targets {
				if t.Via == "" {
					direct[GatewayKey{t.Gateway.Namespace, t.Gateway.Name, ""}] = true
				}
			}
			covered := map[string]bool{}
			first := map[GatewayKey]Target{}
			var order []GatewayKey
			for _, t := range targets {
				if t.Via == "" {
					continue
				}
				gk := GatewayKey{t.Gateway.Namespace, t.Gateway.Name, ""}
				covered[t.Via] = true
				if _, ok := first[gk]; !ok {
					first[gk] = t
					order = append(order, gk)
				}
			}
			for _, gk := range order {
				if direct[gk] {
					continue
				}
				var other []string
				for _, rt := range p.Index.Routes {
					name := rt.Namespace + "/" + rt.Name
					if covered[name] {
						continue
					}
					for _, parent := range routeParents(rt) {
						if parent.Namespace == gk.Namespace && parent.Name == gk.Name {
							other = append(other, name)
							break
						}
					}
				}
				for _, ar := range p.Index.AIGatewayRoutes {
					name := ar.Obj.Namespace + "/" + ar.Obj.Name
					if covered[name] {
						continue
					}
					for _, parent := range ar.Parents {
						if parent.Namespace == gk.Namespace && parent.Name == gk.Name {
							other = append(other, name)
							break
						}
					}
				}
				if len(other) == 0 {
					continue
				}
				t := first[gk]
				p.Report(pol.Obj, t.Node, t.Path, "%s attaches to routes of %s, which also serves %s: principals reach those routes unbudgeted; target the Gateway (kind: Gateway) so one bucket covers every route",
					pol.Obj, gk, strings.Join(dedupe(other), ", "))
			}
		}
		// Resolve every policy's targets, so each invalid selector is seen
		// whichever rules ran before.
		for _, pol := range p.Index.Policies {
			p.Index.Targets(pol.Obj)
		}
		for _, objs := range [][]*manifest.Object{p.Index.SecurityPolicies, p.Index.ClientPolicies} {
			for _, o := range objs {
				p.Index.Targets(o)
			}
		}
		for _, e := range p.Index.SelectorErrors {
			p.Report(e.Obj, e.Node, e.Path, "%s: not a valid label selector (%v): it selects nothing, so the objects it was meant to reach are not covered", e.Path, e.Err)
		}
		return nil
	},
}
