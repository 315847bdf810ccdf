package assert

import (
	"fmt"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// Envoy Gateway's limits on a global rate limit (api/v1alpha1/ratelimit_types.go).
const (
	MaxRulesPerPolicy     = 256
	MaxSelectorsPerRule   = 8
	MaxHeadersPerSelector = 128
	MaxHeaderValueLength  = 1024
)

// ruleLimits: past these limits the API server rejects the policy (and
// with it every budget of the Gateway). Checked here too so the message says
// which limit and what to do, with or without schema validation.
var ruleLimits = &Rule{
	ID:       "BG011",
	Name:     "limits",
	Doc:      "at most 256 rules per policy, 8 selectors per rule, 128 header matches per selector, 1024 characters per header value",
	Severity: Error,
	Check: func(p *Pass) error {
		for _, pol := range p.Index.Policies {
			if n := len(pol.Rules); n > MaxRulesPerPolicy {
				rules := manifest.Get(pol.Obj.Node, "spec", "rateLimit", "global", "rules")
				p.Report(pol.Obj, rules, "spec.rateLimit.global.rules", "%d rules, Envoy Gateway allows %d per policy: move per-principal overrides into fewer rules (a regex exclusion) or raise the default cap", n, MaxRulesPerPolicy)
			}
			for _, r := range pol.Rules {
				sels := manifest.Items(manifest.Get(r.Node, "clientSelectors"))
				if len(sels) > MaxSelectorsPerRule {
					p.Report(pol.Obj, manifest.Get(r.Node, "clientSelectors"), r.Path()+".clientSelectors", "rule %d has %d clientSelectors, Envoy Gateway allows %d", r.Index, len(sels), MaxSelectorsPerRule)
				}
				for s, sel := range sels {
					hs := manifest.Items(manifest.Get(sel, "headers"))
					if len(hs) > MaxHeadersPerSelector {
						p.Report(pol.Obj, manifest.Get(sel, "headers"), fmt.Sprintf("%s.clientSelectors[%d].headers", r.Path(), s), "rule %d selector %d has %d header matches, Envoy Gateway allows %d: exclude overrides with one RegularExpression match instead of one Exact match each", r.Index, s, len(hs), MaxHeadersPerSelector)
					}
				}
				for _, hm := range r.Headers() {
					if len(hm.Value) > MaxHeaderValueLength {
						p.Report(pol.Obj, manifest.Get(hm.Node, "value"), hm.Path+".value", "header match value is %d characters, Envoy Gateway allows %d: split the exclusion across selectors or rules", len(hm.Value), MaxHeaderValueLength)
					}
				}
			}
		}
		return nil
	},
}
