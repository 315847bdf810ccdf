package assert

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// checkAgwSharedTargets reports q's remote rate limit where it sits between
// the Gateway of budget policy b and its routes: agentgateway merges a
// route's traffic policies in the order Gateway, ListenerSet, ListenerSet
// listener, listener, the route's destination service (an InferencePool
// target), route, route rule, the later replacing the earlier
// (crates/agentgateway/src/store/binds.rs route_policies), so q's rate limit
// on a ListenerSet of b's Gateway, or on an InferencePool, replaces b's
// budgets on that traffic. The gate does not model which routes a
// ListenerSet holds or which reach an InferencePool, so it fails closed: a
// ListenerSet the input does not hold, or any InferencePool, is reported too.
func checkAgwSharedTargets(p *Pass, b *manifest.Object, gws []GatewayKey, q *manifest.Object) {
	if len(gws) == 0 {
		return // b holds no Gateway (it targets routes or ListenerSets itself)
	}
	for _, t := range agwKindTargets(p.Index, q, "ListenerSet", GroupGateway) {
		gw, ok := listenerSetParent(p.Index, q.Namespace, t.name, GroupGateway)
		if ok && !agwWholeGateway(gws, gw) {
			continue
		}
		where := "ListenerSet " + q.Namespace + "/" + t.name + ", which is not in the input (the gate cannot tell its Gateway)"
		if ok {
			where = "ListenerSet " + q.Namespace + "/" + t.name + " of Gateway " + gw.Namespace + "/" + gw.Name
		}
		p.Report(q, t.node, t.path, "%s's global rate limit on %s replaces the budgets of %s on that ListenerSet's listeners (agentgateway applies a ListenerSet's traffic policies after its Gateway's: crates/agentgateway/src/store/binds.rs route_policies), so their requests are charged to no budget of %s; put the descriptors in %s, or set spec.strategy.inheritance: Override on %s",
			q, where, b, b.Name, b.Name, b.Name)
	}
	for _, t := range agwKindTargets(p.Index, q, "InferencePool", "inference.networking.k8s.io") {
		p.Report(q, t.node, t.path, "%s's global rate limit on InferencePool %s/%s replaces the budgets of %s on every route that sends to it (agentgateway applies a destination's traffic policies after the Gateway's: crates/agentgateway/src/store/binds.rs route_policies), and the gate does not model which routes do; put the descriptors in %s, or set spec.strategy.inheritance: Override on %s",
			q, q.Namespace, t.name, b, b.Name, b.Name)
	}
}

type agwKindTarget struct {
	name string
	node *yaml.Node
	path string
}

// agwKindTargets lists the objects of kind and group an AgentgatewayPolicy
// attaches to: its targetRefs, and the objects of the input in its namespace
// its targetSelectors select.
func agwKindTargets(ix *Index, o *manifest.Object, kind, group string) []agwKindTarget {
	var out []agwKindTarget
	spec := manifest.Get(o.Node, "spec")
	for i, r := range manifest.Items(manifest.Get(spec, "targetRefs")) {
		if manifest.Str(manifest.Get(r, "kind")) == kind && manifest.Str(manifest.Get(r, "group")) == group {
			out = append(out, agwKindTarget{name: manifest.Str(manifest.Get(r, "name")), node: r, path: fmt.Sprintf("spec.targetRefs[%d]", i)})
		}
	}
	for i, s := range manifest.Items(manifest.Get(spec, "targetSelectors")) {
		if manifest.Str(manifest.Get(s, "kind")) != kind || manifest.Str(manifest.Get(s, "group")) != group {
			continue
		}
		for _, t := range ix.Objects {
			if t.Kind == kind && t.Group() == group && t.Namespace == o.Namespace && labelsHold(t, manifest.Get(s, "matchLabels")) {
				out = append(out, agwKindTarget{name: t.Name, node: s, path: fmt.Sprintf("spec.targetSelectors[%d]", i)})
			}
		}
	}
	return out
}

// listenerSetParent is the Gateway ListenerSet ns/name (of group, or of
// any group when group is "") joins; false when the ListenerSet is not in
// the input.
func listenerSetParent(ix *Index, ns, name, group string) (GatewayKey, bool) {
	for _, o := range ix.Objects {
		if o.Kind != "ListenerSet" || (group != "" && o.Group() != group) || o.Namespace != ns || o.Name != name {
			continue
		}
		ref := manifest.Get(o.Node, "spec", "parentRef")
		gns := manifest.Str(manifest.Get(ref, "namespace"))
		if gns == "" {
			gns = o.Namespace
		}
		return GatewayKey{Namespace: gns, Name: manifest.Str(manifest.Get(ref, "name"))}, true
	}
	return GatewayKey{}, false
}

// agwWholeGateway reports whether gws holds gw as a whole (no listener): a
// budget policy on one listener of the Gateway does not reach a
// ListenerSet's listeners.
func agwWholeGateway(gws []GatewayKey, gw GatewayKey) bool {
	for _, g := range gws {
		if g.Namespace == gw.Namespace && g.Name == gw.Name && g.Section == "" {
			return true
		}
	}
	return false
}
