package assert

import (
	"slices"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleShadow: a token rule enforces only when the budget was promoted. With
// --spec, the spec's mode decides (through the rule-budgets annotation);
// without it, every enforcing token rule must be named by --allow-enforce.
// An engaged kill switch enforces by design and is not a token rule.
var ruleShadow = &Rule{
	ID:       "BG002",
	Name:     "shadow",
	Doc:      "every token rule has shadowMode: true unless its budget is promoted (spec mode enforce, or --allow-enforce)",
	Severity: Error,
	Check: func(p *Pass) error {
		for _, pol := range p.Index.BudgetPolicies() {
			if pol.AnnotationErr != nil {
				p.Report(pol.Obj, pol.Annotation, "metadata.annotations", "annotation %s cannot be read (%v), so no rule can be matched to its budget: render again", RuleBudgetsAnnotation, pol.AnnotationErr)
			}
			for _, r := range pol.Rules {
				if r.Kind != TokenRule {
					continue
				}
				n := manifest.Get(r.Node, "shadowMode")
				if v, ok := manifest.Bool(n); ok && v {
					continue
				}
				at := n
				if at == nil {
					at = r.Node
				}
				if slices.Contains(p.Options.AllowEnforce, r.ID()) || (r.Budget != "" && slices.Contains(p.Options.AllowEnforce, r.Budget)) {
					continue
				}
				if p.Options.Spec != nil {
					if r.Budget == "" {
						p.Report(pol.Obj, at, r.Path()+".shadowMode", "token rule %d enforces but has no %s entry, so the spec cannot say it was promoted; render it again or set shadowMode: true", r.Index, RuleBudgetsAnnotation)
						continue
					}
					if p.Options.Spec.Enforced[r.Budget] {
						continue
					}
					if p.Options.Spec.Budgets != nil && !p.Options.Spec.Budgets[r.Budget] {
						p.Report(pol.Obj, at, r.Path()+".shadowMode", "token rule %d enforces for budget %q, which is not in the spec: render again or set shadowMode: true", r.Index, r.Budget)
						continue
					}
					p.Report(pol.Obj, at, r.Path()+".shadowMode", "token rule %d of budget %q enforces, but the spec has it in shadow mode: set shadowMode: true or promote the budget", r.Index, r.Budget)
					continue
				}
				name := r.ID()
				if r.Budget != "" {
					name = r.Budget
				}
				p.Report(pol.Obj, at, r.Path()+".shadowMode", "token rule %d enforces (no shadowMode: true) and nothing says it was promoted: set shadowMode: true, pass --spec, or --allow-enforce %s", r.Index, name)
			}
		}
		return nil
	},
}
