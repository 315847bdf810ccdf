package assert

import "github.com/budgetgen/budgetgen/pkg/manifest"

// ruleUnit: budgets are daily caps unless the rule-budgets annotation gives
// the rule another window; another unit silently changes the cap.
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
				want := r.wantUnit()
				if manifest.Str(n) == want {
					continue
				}
				if n == nil {
					n = manifest.Get(r.Node, "limit")
				}
				if want != "Day" {
					p.Report(pol.Obj, n, r.Path()+".limit.unit", "token rule %d has limit.unit %q but its rule-budgets entry says per %s: use %s", r.Index, manifest.Str(manifest.Get(r.Node, "limit", "unit")), r.Window, want)
					continue
				}
				p.Report(pol.Obj, n, r.Path()+".limit.unit", "token rule %d has limit.unit %q: token budgets are daily caps, use Day", r.Index, manifest.Str(manifest.Get(r.Node, "limit", "unit")))
			}
		}
		return nil
	},
}
