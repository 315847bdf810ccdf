package assert

import "github.com/budgetgen/budgetgen/internal/manifest"

// ruleUnit: budgets are daily caps; another unit silently changes the cap.
var ruleUnit = &Rule{
	ID:       "BG004",
	Name:     "day-unit",
	Doc:      "token budgets use limit.unit: Day",
	Severity: Error,
	Check: func(p *Pass) error {
		for _, pol := range p.Index.BudgetPolicies() {
			for _, r := range pol.Rules {
				if r.Kind != TokenRule {
					continue
				}
				n := manifest.Get(r.Node, "limit", "unit")
				if manifest.Str(n) == "Day" {
					continue
				}
				if n == nil {
					n = manifest.Get(r.Node, "limit")
				}
				p.Report(pol.Obj, n, r.Path()+".limit.unit", "token rule %d has limit.unit %q: token budgets are daily caps, use Day", r.Index, manifest.Str(manifest.Get(r.Node, "limit", "unit")))
			}
		}
		return nil
	},
}
