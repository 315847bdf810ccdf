package assert

import (
	"fmt"
	"sort"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// How Envoy Gateway v1.9.1 attaches SecurityPolicies, BackendTrafficPolicies
// and ClientTrafficPolicies (internal/gatewayapi in its Go module):
//
//   - Policies are sorted by creationTimestamp, then namespace/name
//     (resource/resource.go, Resources.Sort).
//   - They are translated most specific target first: route rules
//     (sectionName on an xRoute), xRoutes, Gateway listeners (sectionName on
//     a Gateway), Gateways (securitypolicy.go ProcessSecurityPolicies,
//     backendtrafficpolicy.go ProcessBackendTrafficPolicies). A Gateway-level
//     policy sets a route's feature only where nothing more specific did
//     ("if already set - there's a specific level policy, so skip":
//     translateSecurityPolicyForListeners, translateBackendTrafficPolicyForListeners).
//   - A route or route-rule policy with spec.mergeType is merged with the
//     closest parent policy, the listener's, else the Gateway's
//     (processSecurityPolicyForRoute, processBackendTrafficPolicyForRoute).
//     Without mergeType it replaces the parent on its routes.
//   - A second policy of a kind on the same target (same Gateway, listener,
//     route or rule) is refused with reason Conflicted; the first in the sort
//     order is kept (resolveSecurityPolicyGatewayTargetRef and friends;
//     clienttrafficpolicy.go ProcessClientTrafficPolicies, claimedScopes).
//   - A sectionName that names no listener (or no route rule) resolves to
//     nothing (validateGatewayListenerSectionName, validateRouteRuleSectionName).
//   - ClientTrafficPolicies attach to Gateways and listeners only; a
//     listener's policy replaces the Gateway's on that listener.

// level is how specific an attachment is, most specific first.
type level int

// attachment levels.
const (
	levelRule level = iota
	levelRoute
	levelListener
	levelGateway
)

func (l level) String() string {
	return [...]string{"route rule", "route", "listener", "Gateway"}[l]
}

// attachment is one target of one policy.
type attachment struct {
	Policy *manifest.Object
	level  level
	// Key names the target: "Gateway ns/name", "Gateway ns/name section s",
	// "HTTPRoute ns/name", "HTTPRoute ns/name rule r".
	Key string
	// Node and Path locate the targetRef (or targetSelector) in Policy.
	Node *yaml.Node
	Path string
	// Merge is spec.mergeType ("" when unset).
	Merge   string
	created time.Time
}

// conflict is an attachment Envoy Gateway refuses (reason Conflicted)
// because Winner, earlier in its order, already holds the target.
type conflict struct{ Loser, Winner *attachment }

// attachments are the resolved targets of the policies of one kind.
type attachments struct {
	Kind      string
	winners   map[string]*attachment
	conflicts []conflict
	// unbound are targets whose sectionName names no listener of the
	// Gateway (or no rule of the route) in the input: they bind nothing.
	unbound []*attachment
	byObj   map[*manifest.Object][]*attachment // each policy's winning attachments
}

// Kinds of Envoy Gateway policies the gate resolves.
const (
	kindSecurityPolicy       = "SecurityPolicy"
	kindBackendTrafficPolicy = "BackendTrafficPolicy"
	kindClientTrafficPolicy  = "ClientTrafficPolicy"
)

// attachOf resolves the targets of every policy of kind (one of the kind*
// constants) the way Envoy Gateway does (see the comment above). Cached.
func (ix *Index) attachOf(kind string) *attachments {
	if a, ok := ix.attach[kind]; ok {
		return a
	}
	var objs []*manifest.Object
	switch kind {
	case kindSecurityPolicy:
		objs = append(objs, ix.SecurityPolicies...)
	case kindClientTrafficPolicy:
		objs = append(objs, ix.ClientPolicies...)
	case kindBackendTrafficPolicy:
		for _, p := range ix.Policies {
			objs = append(objs, p.Obj)
		}
	}
	egSort(objs)
	a := &attachments{Kind: kind, winners: map[string]*attachment{}, byObj: map[*manifest.Object][]*attachment{}}
	var all []*attachment
	for _, o := range objs {
		all = append(all, ix.resolve(o, kind, a)...)
	}
	for level := levelRule; level <= levelGateway; level++ {
		for _, at := range all {
			if at.level != level {
				continue
			}
			if w, taken := a.winners[at.Key]; taken {
				a.conflicts = append(a.conflicts, conflict{Loser: at, Winner: w})
				continue
			}
			a.winners[at.Key] = at
			a.byObj[at.Policy] = append(a.byObj[at.Policy], at)
		}
	}
	ix.attach[kind] = a
	return a
}

// egSort orders policies as Envoy Gateway does: creationTimestamp (absent:
// the zero time, first), then namespace, then name.
func egSort(objs []*manifest.Object) {
	sort.SliceStable(objs, func(i, j int) bool {
		a, b := created(objs[i]), created(objs[j])
		if !a.Equal(b) {
			return a.Before(b)
		}
		if objs[i].Namespace != objs[j].Namespace {
			return objs[i].Namespace < objs[j].Namespace
		}
		return objs[i].Name < objs[j].Name
	})
}

func created(o *manifest.Object) time.Time {
	t, _ := time.Parse(time.RFC3339, manifest.Str(manifest.Get(o.Node, "metadata", "creationTimestamp")))
	return t
}

// resolve lists the attachments of one policy; those whose sectionName
// binds nothing go to a.unbound instead.
func (ix *Index) resolve(o *manifest.Object, kind string, a *attachments) []*attachment {
	var out []*attachment
	merge := manifest.Str(manifest.Get(o.Node, "spec", "mergeType"))
	for _, r := range ix.policyRefs(o) {
		at := &attachment{Policy: o, Node: r.node, Path: r.path, Merge: merge, created: created(o)}
		switch r.kind {
		case "Gateway":
			gk := GatewayKey{Namespace: r.ns, Name: r.name}
			at.level, at.Key = levelGateway, gatewayAttachKey(gk)
			if r.section != "" {
				at.level, at.Key = levelListener, gatewayAttachKey(GatewayKey{r.ns, r.name, r.section})
				if !ix.hasListener(gk, r.section) {
					a.unbound = append(a.unbound, at)
					continue
				}
			}
		case "HTTPRoute", "GRPCRoute":
			if kind == kindClientTrafficPolicy {
				continue // not a target of ClientTrafficPolicies
			}
			at.level, at.Key = levelRoute, r.kind+" "+r.ns+"/"+r.name
			if r.section != "" {
				at.level, at.Key = levelRule, at.Key+" rule "+r.section
				if rt := ix.xroute(r.kind, r.ns, r.name); rt != nil && !contains(rt.Rules, r.section) {
					a.unbound = append(a.unbound, at)
					continue
				}
			}
		default:
			continue
		}
		out = append(out, at)
	}
	return out
}

func gatewayAttachKey(gk GatewayKey) string {
	if gk.Section != "" {
		return "Gateway " + gk.Namespace + "/" + gk.Name + " section " + gk.Section
	}
	return "Gateway " + gk.Namespace + "/" + gk.Name
}

func (ix *Index) xroute(kind, ns, name string) *xRoute {
	for _, r := range ix.allRoutes() {
		if r.Kind == kind && r.Obj.Namespace == ns && r.Obj.Name == name {
			return r
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// policyRef is one target of a policy: a targetRef, or an object of the
// input a targetSelector selects (selectors carry no sectionName).
type policyRef struct {
	kind, ns, name, section string
	node                    *yaml.Node
	path                    string
}

// policyRefs lists the Gateway and route targets of an Envoy Gateway policy
// in EG's order (helpers.go composePolicyTargetRefs): the objects of the
// input spec.targetSelectors select, then spec.targetRef (deprecated) or else
// spec.targetRefs, except those a selector already gave.
func (ix *Index) policyRefs(o *manifest.Object) []policyRef {
	spec := manifest.Get(o.Node, "spec")
	out := ix.selectedRefs(o, spec)
	selected := map[policyRef]bool{}
	for _, r := range out {
		selected[policyRef{kind: r.kind, ns: r.ns, name: r.name}] = true
	}
	refs, paths := targetRefNodes(spec)
	for i, ref := range refs {
		if g := manifest.Str(manifest.Get(ref, "group")); g != "" && g != GroupGateway {
			continue
		}
		r := policyRef{kind: manifest.Str(manifest.Get(ref, "kind")), ns: o.Namespace, name: manifest.Str(manifest.Get(ref, "name")), section: manifest.Str(manifest.Get(ref, "sectionName"))}
		if r.section == "" && selected[r] {
			continue
		}
		r.node, r.path = ref, paths[i]
		out = append(out, r)
	}
	return out
}

// selectedRefs lists the Gateways and routes of the input o's
// targetSelectors select.
func (ix *Index) selectedRefs(o *manifest.Object, spec *yaml.Node) []policyRef {
	var out []policyRef
	for i, sel := range manifest.Items(manifest.Get(spec, "targetSelectors")) {
		path := fmt.Sprintf("spec.targetSelectors[%d]", i)
		if g := manifest.Str(manifest.Get(sel, "group")); g != "" && g != GroupGateway {
			continue
		}
		kind := manifest.Str(manifest.Get(sel, "kind"))
		cands := ix.Gateways
		if kind != "Gateway" {
			cands = ix.Routes
		}
		for _, c := range cands {
			if c.Kind == kind && ix.selects(o, sel, path, c) {
				out = append(out, policyRef{kind: kind, ns: c.Namespace, name: c.Name, node: sel, path: path})
			}
		}
	}
	return out
}

// winnersOf returns the attachments of policy o that Envoy Gateway keeps.
func (a *attachments) winnersOf(o *manifest.Object) []*attachment { return a.byObj[o] }

// effective returns the attachment whose policy Envoy Gateway applies to
// unit u (nil: none), and, when that policy is a route or route-rule policy
// with spec.mergeType, the parent it is merged with (the listener's policy,
// else the Gateway's; nil when there is none).
func (a *attachments) effective(u routeUnit) (eff, parent *attachment) {
	rk := u.Route.Kind + " " + u.Route.ID()
	if n := u.RuleName(); n != "" {
		eff = a.winners[rk+" rule "+n]
	}
	if eff == nil {
		eff = a.winners[rk]
	}
	if eff == nil {
		return a.onListener(u.Listener), nil
	}
	if eff.Merge != "" {
		parent = a.onListener(u.Listener)
	}
	return eff, parent
}

// onListener returns the listener-level attachment for l (when l names a
// listener and one exists), else the Gateway-level one, else nil: what
// applies to a listener's traffic without a route-level policy.
func (a *attachments) onListener(l GatewayKey) *attachment {
	if l.Section != "" {
		if w := a.winners[gatewayAttachKey(l)]; w != nil {
			return w
		}
	}
	return a.winners[gatewayAttachKey(GatewayKey{Namespace: l.Namespace, Name: l.Name})]
}

// unitsOf lists the route units attachment at reaches (where it would apply
// if nothing more specific did).
func (ix *Index) unitsOf(at *attachment) []routeUnit {
	var out []routeUnit
	for _, u := range ix.allUnits() {
		rk := u.Route.Kind + " " + u.Route.ID()
		switch at.level {
		case levelRule:
			if at.Key == rk+" rule "+u.RuleName() && u.RuleName() != "" {
				out = append(out, u)
			}
		case levelRoute:
			if at.Key == rk {
				out = append(out, u)
			}
		case levelListener:
			if at.Key == gatewayAttachKey(u.Listener) {
				out = append(out, u)
			}
		case levelGateway:
			if at.Key == gatewayAttachKey(u.Gateway()) {
				out = append(out, u)
			}
		}
	}
	return out
}
