package assert

import (
	"sort"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// xRoute is a route Envoy Gateway attaches policies to: an HTTPRoute or
// GRPCRoute of the input, or the HTTPRoute Envoy AI Gateway generates from an
// AIGatewayRoute (same namespace, name and parentRefs; one rule per
// AIGatewayRoute rule, with its name, plus a last rule "route-not-found":
// internal/controller/ai_gateway_route.go, newHTTPRoute, in
// github.com/envoyproxy/ai-gateway v1.1.0).
type xRoute struct {
	Obj *manifest.Object
	// Kind is HTTPRoute or GRPCRoute (HTTPRoute for a generated route).
	Kind string
	// Generated is true for the HTTPRoute of an AIGatewayRoute.
	Generated bool
	// Rules are the names of spec.rules ("" for an unnamed rule); policies
	// target a rule by its name (sectionName).
	Rules []string
	// Parents are the Gateways (and listener, as Section) of spec.parentRefs.
	Parents []GatewayKey
}

// ID is namespace/name.
func (r *xRoute) ID() string { return r.Obj.Namespace + "/" + r.Obj.Name }

// String is "Kind namespace/name".
func (r *xRoute) String() string { return r.Kind + " " + r.ID() }

// routeUnit is one rule of one route on one listener of one Gateway: the
// smallest thing Envoy Gateway gives its own SecurityPolicy and
// BackendTrafficPolicy (an IR route per rule and listener).
type routeUnit struct {
	Route *xRoute
	// Rule is the index into Route.Rules.
	Rule int
	// Listener names the Gateway and the listener (Section; "" when the
	// Gateway is not in the input, so its listeners are unknown).
	Listener GatewayKey
}

// RuleName is the name of the unit's rule ("" when unnamed).
func (u routeUnit) RuleName() string { return u.Route.Rules[u.Rule] }

// Gateway is the unit's Gateway without the listener.
func (u routeUnit) Gateway() GatewayKey {
	return GatewayKey{Namespace: u.Listener.Namespace, Name: u.Listener.Name}
}

// gatewayObject returns the Gateway of the input named by gk (its Section is
// ignored), or nil.
func (ix *Index) gatewayObject(gk GatewayKey) *manifest.Object {
	for _, gw := range ix.Gateways {
		if gw.Namespace == gk.Namespace && gw.Name == gk.Name {
			return gw
		}
	}
	return nil
}

// listeners returns the listener names of the Gateway gk names, and whether
// that Gateway is in the input (without it, no listener is known).
func (ix *Index) listeners(gk GatewayKey) ([]string, bool) {
	gw := ix.gatewayObject(gk)
	if gw == nil {
		return nil, false
	}
	var out []string
	for _, l := range manifest.Items(manifest.Get(gw.Node, "spec", "listeners")) {
		out = append(out, manifest.Str(manifest.Get(l, "name")))
	}
	return out, true
}

// hasListener reports whether section names a listener of the Gateway gk, or
// the Gateway is not in the input (then nothing can be said).
func (ix *Index) hasListener(gk GatewayKey, section string) bool {
	ls, known := ix.listeners(gk)
	if !known {
		return true
	}
	for _, l := range ls {
		if l == section {
			return true
		}
	}
	return false
}

// allRoutes lists the routes of the input, generated ones included, sorted by
// kind and namespace/name. An HTTPRoute of the input shadows the one an
// AIGatewayRoute of the same name would generate.
func (ix *Index) allRoutes() []*xRoute {
	if ix.xroutes != nil {
		return ix.xroutes
	}
	seen := map[string]bool{}
	out := []*xRoute{}
	for _, rt := range ix.Routes {
		r := &xRoute{Obj: rt, Kind: rt.Kind, Parents: routeSections(rt)}
		for _, rule := range manifest.Items(manifest.Get(rt.Node, "spec", "rules")) {
			r.Rules = append(r.Rules, manifest.Str(manifest.Get(rule, "name")))
		}
		if len(r.Rules) == 0 {
			r.Rules = []string{""}
		}
		seen[r.Kind+" "+r.ID()] = true
		out = append(out, r)
	}
	for _, ar := range ix.aiRoutes {
		r := &xRoute{Obj: ar.Obj, Kind: "HTTPRoute", Generated: true}
		if seen[r.String()] {
			continue
		}
		for _, p := range ar.Parents {
			r.Parents = append(r.Parents, GatewayKey{Namespace: p.Namespace, Name: p.Name, Section: manifest.Str(manifest.Get(p.Node, "sectionName"))})
		}
		for _, rule := range manifest.Items(manifest.Get(ar.Obj.Node, "spec", "rules")) {
			r.Rules = append(r.Rules, manifest.Str(manifest.Get(rule, "name")))
		}
		r.Rules = append(r.Rules, "route-not-found")
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	ix.xroutes = out
	return out
}

// routeSections is routeParents with each parentRef's sectionName.
func routeSections(rt *manifest.Object) []GatewayKey {
	var out []GatewayKey
	for _, pr := range manifest.Items(manifest.Get(rt.Node, "spec", "parentRefs")) {
		if k := manifest.Str(manifest.Get(pr, "kind")); k != "" && k != "Gateway" {
			continue
		}
		ns := manifest.Str(manifest.Get(pr, "namespace"))
		if ns == "" {
			ns = rt.Namespace
		}
		out = append(out, GatewayKey{Namespace: ns, Name: manifest.Str(manifest.Get(pr, "name")), Section: manifest.Str(manifest.Get(pr, "sectionName"))})
	}
	return out
}

// allUnits lists every route unit of the input: each rule of each route on each
// listener its parentRefs attach it to (every listener of the Gateway when
// the parentRef names none; one unknown listener when the Gateway is not in
// the input). Listeners' allowedRoutes are not modelled.
func (ix *Index) allUnits() []routeUnit {
	if ix.units != nil {
		return ix.units
	}
	out := []routeUnit{}
	for _, r := range ix.allRoutes() {
		seen := map[GatewayKey]bool{}
		for _, p := range r.Parents {
			for _, l := range ix.parentListeners(p) {
				if seen[l] {
					continue
				}
				seen[l] = true
				for i := range r.Rules {
					out = append(out, routeUnit{Route: r, Rule: i, Listener: l})
				}
			}
		}
	}
	ix.units = out
	return out
}

// parentListeners expands a parentRef to the listeners it attaches to.
func (ix *Index) parentListeners(p GatewayKey) []GatewayKey {
	gk := GatewayKey{Namespace: p.Namespace, Name: p.Name}
	ls, known := ix.listeners(gk)
	switch {
	case !known:
		return []GatewayKey{p}
	case p.Section != "":
		if ix.hasListener(gk, p.Section) {
			return []GatewayKey{p}
		}
		return nil
	}
	out := make([]GatewayKey, 0, len(ls))
	for _, l := range ls {
		out = append(out, GatewayKey{Namespace: p.Namespace, Name: p.Name, Section: l})
	}
	return out
}
