package assert

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// checkListenerSets fails closed on the ListenerSets of budgeted Gateways,
// which the gate does not model. A ListenerSet adds listeners to a Gateway,
// and Envoy Gateway v1.9.1 applies the policies that target a ListenerSet, and
// the route policies of routes attached through one, before and instead of the
// Gateway's (internal/gatewayapi/backendtrafficpolicy.go,
// ProcessBackendTrafficPolicies: "Then translate Policies targeting ListenerSet
// Listeners", processBackendTrafficPolicyForRoute; SecurityPolicy and
// ClientTrafficPolicy likewise). So a BackendTrafficPolicy there may drop the
// budgets from its routes, a SecurityPolicy change the identity they count by,
// a ClientTrafficPolicy leave identity headers spoofable. Reported: every
// Envoy Gateway policy that targets a ListenerSet of a budgeted Gateway, or one
// whose Gateway the input does not show, and every route policy on a route
// attached through such a ListenerSet.
func checkListenerSets(p *Pass) {
	ls := listenerSets{p: p, budgeted: budgetGateways(p.Index)}
	if len(ls.budgeted) == 0 {
		return
	}
	for _, o := range p.Index.Objects {
		if o.Group() != GroupEG || (o.Kind != kindBackendTrafficPolicy && o.Kind != kindSecurityPolicy && o.Kind != kindClientTrafficPolicy) {
			continue
		}
		spec := manifest.Get(o.Node, "spec")
		for i, sel := range manifest.Items(manifest.Get(spec, "targetSelectors")) {
			if manifest.Str(manifest.Get(sel, "kind")) == "ListenerSet" {
				p.Report(o, sel, fmt.Sprintf("spec.targetSelectors[%d]", i), "selects ListenerSets beside budget policy %s: Envoy Gateway applies a ListenerSet's policies before and instead of its Gateway's, and the gate does not model ListenerSets, so the budgets may not bind on their routes; target the Gateway or name the ListenerSets", ls.firstBudget())
			}
		}
		refs, paths := targetRefNodes(spec)
		for i, ref := range refs {
			if g := manifest.Str(manifest.Get(ref, "group")); g != "" && g != GroupGateway {
				continue
			}
			name := manifest.Str(manifest.Get(ref, "name"))
			switch manifest.Str(manifest.Get(ref, "kind")) {
			case "ListenerSet":
				ls.report(o, ref, paths[i], "targets", o.Namespace, name)
			case "HTTPRoute", "GRPCRoute":
				if o.Kind != kindClientTrafficPolicy { // a ClientTrafficPolicy targets Gateways only
					ls.reportRoute(o, ref, paths[i], name)
				}
			}
		}
	}
}

// budgetGateways maps each Gateway (no section) a budget policy reaches to
// the first such policy's name.
func budgetGateways(ix *Index) map[GatewayKey]string {
	budgeted := map[GatewayKey]string{}
	for _, pol := range ix.BudgetPolicies() {
		for _, t := range ix.Targets(pol.Obj) {
			g := GatewayKey{Namespace: t.Gateway.Namespace, Name: t.Gateway.Name}
			if _, ok := budgeted[g]; !ok {
				budgeted[g] = pol.Obj.String()
			}
		}
	}
	return budgeted
}

// listenerSets reports policies that reach ListenerSets of budgeted Gateways.
type listenerSets struct {
	p        *Pass
	budgeted map[GatewayKey]string
}

// parent is the budget policy whose Gateway ListenerSet ns/name joins, ""
// when none does; ok is false when the ListenerSet is not in the input.
func (ls listenerSets) parent(ns, name string) (budget string, ok bool) {
	gw, ok := listenerSetParent(ls.p.Index, ns, name, "")
	if !ok {
		return "", false
	}
	return ls.budgeted[gw], true
}

func (ls listenerSets) report(o *manifest.Object, n *yaml.Node, path, what, ns, name string) {
	budget, ok := ls.parent(ns, name)
	switch {
	case !ok:
		ls.p.Report(o, n, path, "%s ListenerSet %s/%s, which is not in the input, beside budget policy %s: Envoy Gateway applies a ListenerSet's policies before and instead of its Gateway's, and the gate does not model ListenerSets, so the budgets may not bind on its routes; add the ListenerSet to the input (its Gateway decides) or target the Gateway", what, ns, name, ls.firstBudget())
	case budget != "":
		ls.p.Report(o, n, path, "%s ListenerSet %s/%s of a Gateway that budget policy %s covers: Envoy Gateway applies a ListenerSet's policies before and instead of its Gateway's, and the gate does not model ListenerSets, so the budgets may not bind on its routes; target the Gateway, or keep budgeted traffic off the ListenerSet", what, ns, name, budget)
	}
}

// reportRoute reports a route policy on a route of the input, named name in
// o's namespace, attached through a ListenerSet.
func (ls listenerSets) reportRoute(o *manifest.Object, ref *yaml.Node, path, name string) {
	for _, rt := range ls.p.Index.Routes {
		if rt.Namespace != o.Namespace || rt.Name != name {
			continue
		}
		for _, pr := range manifest.Items(manifest.Get(rt.Node, "spec", "parentRefs")) {
			if manifest.Str(manifest.Get(pr, "kind")) != "ListenerSet" {
				continue
			}
			ns := manifest.Str(manifest.Get(pr, "namespace"))
			if ns == "" {
				ns = rt.Namespace
			}
			ls.report(o, ref, path, "targets route "+rt.String()+", attached through", ns, manifest.Str(manifest.Get(pr, "name")))
		}
	}
}

// firstBudget names one budget policy, the first in order.
func (ls listenerSets) firstBudget() string {
	first := ""
	for _, name := range ls.budgeted {
		if first == "" || name < first {
			first = name
		}
	}
	return first
}

// targetRefNodes is spec.targetRef, or else spec.targetRefs, with their
// paths: EG reads targetRefs only without targetRef
// (api/v1alpha1/policy_helpers.go, GetTargetRefs), and the CRD allows both
// beside targetSelectors.
func targetRefNodes(spec *yaml.Node) ([]*yaml.Node, []string) {
	if r := manifest.Get(spec, "targetRef"); r != nil {
		return []*yaml.Node{r}, []string{"spec.targetRef"}
	}
	refs := manifest.Items(manifest.Get(spec, "targetRefs"))
	paths := make([]string, len(refs))
	for i := range refs {
		paths[i] = fmt.Sprintf("spec.targetRefs[%d]", i)
	}
	return refs, paths
}
