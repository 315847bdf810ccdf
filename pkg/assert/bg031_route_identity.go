package assert

import (
	"fmt"
	"sort"
	"strings"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleRouteIdentity: a budget keyed on an identity header binds a request
// only if the request carries the header, set from its verified credential.
// Envoy Gateway applies one SecurityPolicy per route - the most specific
// (route rule, route, listener, Gateway), merged with the listener's or
// Gateway's only when it sets mergeType (internal/gatewayapi/securitypolicy.go,
// processSecurityPolicyForRoute, translateSecurityPolicyForListeners) - so a
// route-level SecurityPolicy (a CORS rule, an extra provider) silently
// replaces the Gateway's credential and its claimToHeaders on that route.
// And within the policy that applies, a request passes with any one of the
// JWT providers (and with every other method configured): a provider, an API
// key check or an ext auth service that admits principals without setting
// any header the budgets key on lets them run on no per-principal budget.
// Checked per route the budget policy reaches (BG030's reach).
var ruleRouteIdentity = &Rule{
	ID:       "BG031",
	Name:     "route-identity",
	Doc:      "on every route a budget policy reaches, the SecurityPolicy EG applies (precedence, mergeType) sets one of the budgets' identity headers from every credential it accepts",
	Severity: Error,
	Check: func(p *Pass) error {
		model := strings.ToLower(p.Options.modelHeader())
		reported := map[string]bool{}
		for _, pol := range p.Index.BudgetPolicies() {
			hs := identityHeaders(pol, model)
			if len(hs) == 0 {
				continue
			}
			applied, _ := budgetReach(p.Index, pol.Obj)
			for _, g := range groupBySecurity(p.Index, applied) {
				checkRouteIdentity(p, pol.Obj, hs, g, reported)
			}
		}
		return nil
	},
}

// identityHeaders is the set of headers pol's rules select on, but the model header.
func identityHeaders(pol *Policy, model string) map[string]bool {
	hs := map[string]bool{}
	for _, r := range pol.Rules {
		for _, hm := range r.Headers() {
			if hm.Name != model {
				hs[hm.Name] = true
			}
		}
	}
	return hs
}

// securityGroup is the route units that get the same effective SecurityPolicy.
type securityGroup struct {
	eff, parent *attachment
	units       []routeUnit
}

func groupBySecurity(ix *Index, units []routeUnit) []*securityGroup {
	sps := ix.attachOf(kindSecurityPolicy)
	var out []*securityGroup
	byKey := map[[2]*manifest.Object]*securityGroup{}
	for _, u := range units {
		eff, parent := sps.effective(u)
		var k [2]*manifest.Object
		if eff != nil {
			k[0] = eff.Policy
		}
		if parent != nil {
			k[1] = parent.Policy
		}
		g := byKey[k]
		if g == nil {
			g = &securityGroup{eff: eff, parent: parent}
			byKey[k] = g
			out = append(out, g)
		}
		g.units = append(g.units, u)
	}
	return out
}

// checkRouteIdentity checks one group of routes of budget policy pol.
func checkRouteIdentity(p *Pass, pol *manifest.Object, hs map[string]bool, g *securityGroup, reported map[string]bool) {
	if g.eff == nil {
		return // no SecurityPolicy at all: BG012 warns about such routes
	}
	spec, owner, err := p.Index.effectiveSecurity(g.eff, g.parent)
	if err != nil {
		p.Report(g.eff.Policy, g.eff.Node, g.eff.Path, "cannot compute the SecurityPolicy EG applies on %s: %v", routeList(g.units), err)
		return
	}
	creds := credentials(spec, owner)
	report := func(o *manifest.Object, path, format string, args ...any) {
		key := o.String() + "|" + path + "|" + pol.String()
		if !reported[key] {
			reported[key] = true
			p.Report(o, NodeAt(o.Node, path), path, format, args...)
		}
	}
	names := headerNames(hs)
	shared := ""
	if bp := policyOf(p.Index, pol); bp != nil {
		shared = sharedUnidentified(bp)
	}
	replaced := replacedSetter(p.Index, g, hs)
	var setting int
	for _, c := range creds {
		if c.Sets(hs) {
			setting++
		}
	}
	switch {
	case len(creds) == 0 && replaced != nil:
		report(g.eff.Policy, g.eff.Path, "%s on %s replaces %s there (EG applies the most specific SecurityPolicy; no mergeType), and authenticates nothing: requests on %s carry none of %s and spend no per-principal budget of %s%s; set spec.mergeType: StrategicMerge on %s, or repeat the credential and its claimToHeaders",
			g.eff.Policy, g.eff.Key, replaced.Policy, routeList(g.units), names, pol.Name, shared, g.eff.Policy.Name)
	case len(creds) > 0 && setting == 0:
		what := ""
		if replaced != nil {
			what = fmt.Sprintf(" (it replaces %s, which does; EG applies the most specific SecurityPolicy, merged only with spec.mergeType)", replaced.Policy)
		}
		report(g.eff.Policy, g.eff.Path, "%s authenticates requests on %s (%s) but sets none of %s%s: its principals run on no per-principal budget of %s%s; map a claim to one of them (jwt claimToHeaders, apiKeyAuth forwardClientIDHeader, extAuth.http headersToBackend)",
			g.eff.Policy, routeList(g.units), credNames(creds), names, what, pol.Name, shared)
	case setting < len(creds):
		checkEachCredential(creds, hs, func(c credential) {
			report(c.Owner, c.Path, "%s of %s admits requests on %s without setting any of %s (a request passes with any one JWT provider): its principals run on no per-principal budget of %s%s; add claimToHeaders for one of them to this provider",
				c.What, c.Owner, routeList(g.units), names, pol.Name, shared)
		})
	}
}

// checkEachCredential calls bad for each JWT provider that sets none of hs,
// unless a method every request must also pass (API key, ext auth) sets one.
func checkEachCredential(creds []credential, hs map[string]bool, bad func(credential)) {
	for _, c := range creds {
		if !c.JWT && c.Sets(hs) {
			return // every request carries that method's header
		}
	}
	for _, c := range creds {
		if c.JWT && !c.Sets(hs) {
			bad(c)
		}
	}
}

// replacedSetter returns the less specific SecurityPolicy that would apply to
// the group's routes without g.eff and sets one of hs, or nil.
func replacedSetter(ix *Index, g *securityGroup, hs map[string]bool) *attachment {
	if g.eff.Merge != "" && g.parent != nil {
		return nil // merged, not replaced
	}
	sps := ix.attachOf(kindSecurityPolicy)
	for _, u := range g.units {
		var lower *attachment
		switch g.eff.level {
		case levelRule, levelRoute:
			lower = sps.onListener(u.Listener)
		case levelListener:
			lower = sps.onListener(u.Gateway())
		}
		if lower == nil || lower == g.eff {
			continue
		}
		spec, owner, err := ix.effectiveSecurity(lower, nil)
		if err != nil {
			continue
		}
		for _, c := range credentials(spec, owner) {
			if c.Sets(hs) {
				return lower
			}
		}
	}
	return nil
}

func headerNames(hs map[string]bool) string {
	out := make([]string, 0, len(hs))
	for h := range hs {
		out = append(out, h)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func credNames(cs []credential) string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.What)
	}
	return strings.Join(out, ", ")
}
