package assert

import "github.com/budgetgen/budgetgen/pkg/manifest"

// ruleShared: a non-shared global rule gets a separate counter per route
// (its descriptor starts with the route name), so a principal spends the
// budget once per route it can reach. Plain request rate limits next to the
// budgets (a base policy's own rules) are left alone.
var ruleShared = &Rule{
	ID:       "BG001",
	Name:     "shared",
	Doc:      "every token rule and kill switch of a budget policy sets shared: true",
	Severity: Error,
	Check: func(p *Pass) error {
		for _, pol := range p.Index.BudgetPolicies() {
			for _, r := range pol.Rules {
				if r.Kind == OtherRule {
					continue // a plain request rate limit (a base policy's own rule) may be per route on purpose
				}
				n := manifest.Get(r.Node, "shared")
				if v, ok := manifest.Bool(n); ok && v {
					continue
				}
				if n == nil {
					p.Report(pol.Obj, r.Node, r.Path()+".shared", "%s %d has no shared: true: each route gets its own counter, so the budget multiplies by the routes a principal can reach", r.Kind, r.Index)
					continue
				}
				p.Report(pol.Obj, n, r.Path()+".shared", "%s %d has shared: %s: each route gets its own counter, so the budget multiplies by the routes a principal can reach", r.Kind, r.Index, n.Value)
			}
		}
		return nil
	},
}
