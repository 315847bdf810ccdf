package assert

import (
	"sort"
)

// ruleConflict: Envoy Gateway attaches one BackendTrafficPolicy per Gateway
// (and one per Gateway listener); it orders policies by creationTimestamp,
// then namespace/name, accepts the first and marks the others
// Accepted=False, reason Conflicted - their budgets silently do nothing.
var ruleConflict = &Rule{
	ID:       "BG005",
	Name:     "one-policy-per-gateway",
	Doc:      "at most one BackendTrafficPolicy targets each Gateway (per sectionName)",
	Severity: Error,
	Check: func(p *Pass) error {
		pols := append([]*Policy(nil), p.Index.Policies...)
		// EG's order: oldest first, then namespace/name.
		sort.SliceStable(pols, func(i, j int) bool {
			a, b := pols[i], pols[j]
			if !a.Created.Equal(b.Created) {
				return a.Created.Before(b.Created)
			}
			if a.Obj.Namespace != b.Obj.Namespace {
				return a.Obj.Namespace < b.Obj.Namespace
			}
			return a.Obj.Name < b.Obj.Name
		})
		winner := map[GatewayKey]*Policy{}
		for _, pol := range pols {
			for _, t := range p.Index.Targets(pol.Obj) {
				if t.Via != "" {
					continue // route-level policies do not compete with Gateway-level ones
				}
				w, ok := winner[t.Gateway]
				if !ok {
					winner[t.Gateway] = pol
					continue
				}
				if w == pol {
					p.Report(pol.Obj, t.Node, t.Path, "%s targets %s twice: EG marks the policy Conflicted", pol.Obj, t.Gateway)
					continue
				}
				order := "the older by creationTimestamp"
				switch {
				case w.Created.IsZero() || pol.Created.IsZero():
					order = "first by namespace/name here, as the manifests carry no creationTimestamp; on a cluster the older object wins"
				case w.Created.Equal(pol.Created):
					order = "same creationTimestamp, first by namespace/name"
				}
				p.Report(pol.Obj, t.Node, t.Path, "%s is already targeted by %s: EG accepts %s (%s) and marks %s Accepted=False, reason Conflicted; merge them into one policy: give budgetgen the other policy as spec.gateways[].basePolicy and it renders one policy with both",
					t.Gateway, w.Obj, w.Obj, order, pol.Obj)
			}
		}
		return nil
	},
}
