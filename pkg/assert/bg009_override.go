package assert

import (
	"regexp"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleOverride: EG applies every matching rule, and a request is denied when
// any of its buckets is empty. An override giving one principal a higher cap
// (an Exact rule) therefore binds only if that principal is excluded from the
// Distinct rule with the default cap; otherwise the lower default still denies.
var ruleOverride = &Rule{
	ID:       "BG009",
	Name:     "override-binds",
	Doc:      "an Exact-principal rule with a higher cap than a Distinct rule on the same header is excluded from that Distinct rule",
	Severity: Error,
	Check: func(p *Pass) error {
		for _, pol := range p.Index.BudgetPolicies() {
			for _, e := range pol.Rules {
				if e.Kind != TokenRule {
					continue
				}
				for _, em := range e.Headers() {
					if em.Type != "Exact" || em.Invert || !em.HasValue {
						continue
					}
					for _, d := range pol.Rules {
						if d == e || d.Kind != TokenRule || !hasDistinct(d, em.Name) {
							continue
						}
						ecap, eok := perSecondCap(e)
						dcap, dok := perSecondCap(d)
						if !eok || !dok || ecap <= dcap {
							continue // a lower override binds anyway: both buckets apply
						}
						if excludes(d, em.Name, em.Value) {
							continue
						}
						p.Report(pol.Obj, manifest.Get(em.Node, "value"), em.Path+".value",
							"override %s=%s (rule %d, %s) is not excluded from Distinct rule %d (%s) on the same header, so the lower cap still denies it: add {name: %s, type: Exact, value: %s, invert: true} to rule %d",
							em.Name, em.Value, e.Index, capString(e), d.Index, capString(d), em.Name, em.Value, d.Index)
					}
				}
			}
		}
		return nil
	},
}

func hasDistinct(r *RateRule, header string) bool {
	for _, m := range r.Headers() {
		if m.Type == "Distinct" && m.Name == header {
			return true
		}
	}
	return false
}

// excludes reports whether r has an inverted match on header that rejects value.
func excludes(r *RateRule, header, value string) bool {
	for _, m := range r.Headers() {
		if !m.Invert || m.Name != header {
			continue
		}
		switch m.Type {
		case "Exact":
			if m.Value == value {
				return true
			}
		case "RegularExpression":
			// Envoy matches the whole value (RE2, like Go's regexp).
			if re, err := regexp.Compile("^(?:" + m.Value + ")$"); err == nil && re.MatchString(value) {
				return true
			}
		}
	}
	return false
}

var unitSeconds = map[string]float64{
	"Second": 1, "Minute": 60, "Hour": 3600, "Day": 86400, "Week": 7 * 86400, "Month": 30 * 86400, "Year": 365 * 86400,
}

// perSecondCap normalises a rule's limit so caps in different units compare.
func perSecondCap(r *RateRule) (float64, bool) {
	n, ok := manifest.Int(manifest.Get(r.Node, "limit", "requests"))
	s, uok := unitSeconds[manifest.Str(manifest.Get(r.Node, "limit", "unit"))]
	if !ok || !uok {
		return 0, false
	}
	return float64(n) / s, true
}

func capString(r *RateRule) string {
	return manifest.Str(manifest.Get(r.Node, "limit", "requests")) + "/" + manifest.Str(manifest.Get(r.Node, "limit", "unit"))
}
