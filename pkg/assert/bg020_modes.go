package assert

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// rateLimitConfigs indexes the rate limit service config documents of the
// input by domain (the first one of a domain; the service refuses two).
func rateLimitConfigs(objs []*manifest.Object) map[string]*manifest.Object {
	out := map[string]*manifest.Object{}
	for _, o := range objs {
		if o.IsRateLimitConfig() {
			if _, dup := out[o.Name]; !dup {
				out[o.Name] = o
			}
		}
	}
	return out
}

// agwLimit is one limit of an agentgateway budget in the server's config:
// a descriptor with rate_limit under `key: budget, value: <budget>`.
type agwLimit struct {
	node   *yaml.Node // the descriptor mapping
	path   string
	shadow *yaml.Node // its shadow_mode value, nil when absent
}

// checkAgentgatewayModes compares the rate limit config of g's domain with
// the spec: agentgateway never sends a shadow flag, so a budget promoted in
// the spec but still shadow_mode: true in the server's config never denies,
// and a shadow budget whose limit lost shadow_mode denies before anyone
// decided so. Every budget the policy names needs a limit there (else the
// server answers OK and the budget counts nothing), and the config names no
// budget the spec lacks.
func checkAgentgatewayModes(p *Pass, pol *manifest.Object, g *agentgateway.GlobalRateLimit, configs map[string]*manifest.Object) {
	cfg := configs[g.Domain]
	if cfg == nil {
		p.ReportSeverity(Warning, pol, NodeAt(pol.Node, agwGlobalPath+".domain"), agwGlobalPath+".domain",
			"the rate limit config of domain %q is not in the input: cannot check that its budgets' limits and shadow modes match the spec; pass the directory budgetgen render --ratelimit-config writes", g.Domain)
		return
	}
	limits := map[string][]agwLimit{}
	var order []string
	for i, d := range manifest.Items(manifest.Get(cfg.Node, "descriptors")) {
		if manifest.Str(manifest.Get(d, "key")) != "budget" {
			continue
		}
		name := manifest.Str(manifest.Get(d, "value"))
		path := fmt.Sprintf("descriptors[%d]", i)
		if _, seen := limits[name]; !seen {
			order = append(order, name)
		}
		limits[name] = append(limits[name], collectLimits(d, path)...)
		if p.Options.Spec.Budgets != nil && !p.Options.Spec.Budgets[name] {
			p.Report(cfg, manifest.Get(d, "value"), path+".value", "%s.value: rate limit config of domain %q has a limit for budget %q, which is not in the spec: render again", path, g.Domain, name)
		}
	}
	for i, d := range g.Descriptors {
		for _, e := range d.Entries {
			name, ok := celLiteral(e.Expression)
			if e.Name != "budget" || !ok {
				continue
			}
			if len(limits[name]) == 0 && (p.Options.Spec.Budgets == nil || p.Options.Spec.Budgets[name]) {
				dp := fmt.Sprintf("%s.descriptors[%d]", agwGlobalPath, i)
				p.Report(pol, NodeAt(pol.Node, dp), dp, "%s: budget %q has no limit in the rate limit config of domain %q (%s): the server answers OK for it and it counts nothing; render again with --ratelimit-config", dp, name, g.Domain, cfg.File)
			}
		}
	}
	for _, name := range order {
		enforce := p.Options.Spec.Enforced[name]
		for _, l := range limits[name] {
			shadow := l.shadow != nil && l.shadow.Value == "true"
			switch {
			case enforce && shadow:
				p.Report(cfg, l.shadow, l.path+".shadow_mode", "%s.shadow_mode: budget %q is in enforce mode in the spec, but its limit in the rate limit config of domain %q still has shadow_mode: true, so agentgateway never denies: render again", l.path, name, g.Domain)
			case !enforce && !shadow:
				n, path := l.node, l.path
				if l.shadow != nil {
					n, path = l.shadow, l.path+".shadow_mode"
				}
				p.Report(cfg, n, path, "%s: budget %q is in shadow mode in the spec, but its limit in the rate limit config of domain %q has no shadow_mode: true, so agentgateway denies: render again, or promote the budget", path, name, g.Domain)
			}
		}
	}
}

// collectLimits returns the descriptors with a rate_limit at or under d.
func collectLimits(d *yaml.Node, path string) []agwLimit {
	var out []agwLimit
	if manifest.Get(d, "rate_limit") != nil {
		out = append(out, agwLimit{node: d, path: path, shadow: manifest.Get(d, "shadow_mode")})
	}
	for i, c := range manifest.Items(manifest.Get(d, "descriptors")) {
		out = append(out, collectLimits(c, fmt.Sprintf("%s.descriptors[%d]", path, i))...)
	}
	return out
}
