package assert

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleGatewayScope: a budget is one bucket per principal across every route
// the principal can reach. A budget policy attached to HTTPRoutes/GRPCRoutes
// (targetRefs or targetSelectors) rather than the Gateway leaves the
// Gateway's other routes unbudgeted: a principal sends its requests there.
// And a targetSelector that is not a valid label selector (an unknown
// operator) selects nothing, so whatever it was meant to reach is not covered;
// EG refuses it the same way. Targets are resolved against the Gateways and
// routes of the input: a sectionName naming no listener of the Gateway (or no
// rule of the route) binds nothing (internal/gatewayapi
// validateGatewayListenerSectionName, validateRouteRuleSectionName), and a
// budget policy whose targetSelectors select nothing in the input binds
// nowhere the gate can see: both are errors.
var ruleGatewayScope = &Rule{
	ID:       "BG015",
	Name:     "gateway-scope",
	Doc:      "a budget policy attached to routes covers every route of their Gateway; targets resolve in the input (valid label selectors that select something, sectionNames naming a listener or route rule)",
	Severity: Error,
	Check: func(p *Pass) error {
		checkRouteScope(p)
		checkTargetsResolve(p)
		return nil
	},
}

// checkRouteScope reports budget policies attached to some routes of a
// Gateway while other routes of that Gateway are in the input.
func checkRouteScope(p *Pass) {
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
			for _, ar := range p.Index.aiRoutes {
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
}

// checkTargetsResolve reports invalid selectors, sectionNames that bind
// nothing, and budget policies' selectors that select nothing.
func checkTargetsResolve(p *Pass) {
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
	for _, objs := range [][]*manifest.Object{p.Index.SecurityPolicies, p.Index.ClientPolicies} {
		for _, o := range objs {
			reportIgnoredTargetRefs(p, o)
		}
	}
	for _, pol := range p.Index.Policies {
		reportIgnoredTargetRefs(p, pol.Obj)
	}
	for _, e := range p.Index.SelectorErrors {
		p.Report(e.Obj, e.Node, e.Path, "%s: not a valid label selector (%v): it selects nothing, so the objects it was meant to reach are not covered", e.Path, e.Err)
	}
	for _, kind := range []string{kindBackendTrafficPolicy, kindSecurityPolicy, kindClientTrafficPolicy} {
		for _, at := range p.Index.attachOf(kind).unbound {
			reportUnbound(p, at)
		}
	}
	for _, pol := range p.Index.BudgetPolicies() {
		checkSelectorsSelect(p, pol.Obj)
	}
}

// reportIgnoredTargetRefs reports spec.targetRefs beside the deprecated
// spec.targetRef: the CRD accepts both when targetSelectors is set, and EG
// then reads targetRef alone (api/v1alpha1/policy_helpers.go, GetTargetRefs),
// so whatever only targetRefs names is not a target.
func reportIgnoredTargetRefs(p *Pass, o *manifest.Object) {
	spec := manifest.Get(o.Node, "spec")
	refs := manifest.Get(spec, "targetRefs")
	if manifest.Get(spec, "targetRef") == nil || len(manifest.Items(refs)) == 0 {
		return
	}
	p.Report(o, refs, "spec.targetRefs", "spec.targetRefs is ignored: with spec.targetRef set, EG reads targetRef alone (api/v1alpha1/policy_helpers.go, GetTargetRefs), so %s does not attach to what only targetRefs names; move targetRef into targetRefs", o)
}

func reportUnbound(p *Pass, at *attachment) {
	section := manifest.Str(manifest.Get(at.Node, "sectionName"))
	kind, name := manifest.Str(manifest.Get(at.Node, "kind")), manifest.Str(manifest.Get(at.Node, "name"))
	if at.level == levelListener {
		ls, _ := p.Index.listeners(GatewayKey{Namespace: at.Policy.Namespace, Name: name})
		p.Report(at.Policy, at.Node, at.Path+".sectionName", "sectionName %q names no listener of Gateway %s/%s (listeners: %s): EG resolves this target to nothing, so %s binds nothing there; name one of the listeners, or drop sectionName for the whole Gateway",
			section, at.Policy.Namespace, name, strings.Join(ls, ", "), at.Policy)
		return
	}
	rt := p.Index.xroute(kind, at.Policy.Namespace, name)
	p.Report(at.Policy, at.Node, at.Path+".sectionName", "sectionName %q names no rule of %s (rule names: %s): EG resolves this target to nothing, so %s binds nothing there; name a rule (spec.rules[].name), or drop sectionName for the whole route",
		section, rt, strings.Join(nonEmpty(rt.Rules), ", "), at.Policy)
}

// checkSelectorsSelect reports each valid targetSelector of a budget policy
// that selects no object of the input: its budgets bind nowhere the gate can
// see (a gate fails closed; pass the Gateways and routes along).
func checkSelectorsSelect(p *Pass, o *manifest.Object) {
	refs := p.Index.selectedRefs(o, manifest.Get(o.Node, "spec"))
	for i, sel := range manifest.Items(manifest.Get(o.Node, "spec", "targetSelectors")) {
		path := fmt.Sprintf("spec.targetSelectors[%d]", i)
		if g := manifest.Str(manifest.Get(sel, "group")); g != "" && g != GroupGateway {
			continue
		}
		if _, ok := p.Index.selectors[sel]; ok && p.Index.selectors[sel] == nil {
			continue // invalid: reported above
		}
		found := false
		for _, r := range refs {
			found = found || r.node == sel
		}
		if !found {
			if names := ungrantedSelections(p.Index, o, sel, path); names != "" {
				p.Report(o, sel, path, "%s selects %s in another namespace, but no ReferenceGrant in the input lets a %s of namespace %s refer to it: EG v1.9.1 drops such a target (internal/gatewayapi/helpers.go, isCrossNamespaceReferencePermitted), so the budgets of %s bind nowhere; add a ReferenceGrant in the target's namespace (from group %s, kind %s, namespace %s; to the target's kind), or put the policy in the target's namespace", path, names, o.Kind, o.Namespace, o, o.Group(), o.Kind, o.Namespace)
				continue
			}
			p.Report(o, sel, path, "%s selects no %s in the input: the budgets of %s bind nowhere the gate can see; pass the Gateways (and routes) this policy is meant for, or use targetRefs", path, manifest.Str(manifest.Get(sel, "kind")), o)
		}
	}
}

// ungrantedSelections names the objects of the input selector sel of o would
// select but for a missing ReferenceGrant ("" when none).
func ungrantedSelections(ix *Index, o *manifest.Object, sel *yaml.Node, path string) string {
	kind := manifest.Str(manifest.Get(sel, "kind"))
	cands := ix.Gateways
	if kind != "Gateway" {
		cands = ix.Routes
	}
	var out []string
	for _, c := range cands {
		if c.Kind == kind && ix.selectsIgnoringGrants(o, sel, path, c) && !ix.crossNamespaceGranted(o, c) {
			out = append(out, c.Kind+" "+c.Namespace+"/"+c.Name)
		}
	}
	return strings.Join(dedupe(out), ", ")
}

func nonEmpty(ss []string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}
