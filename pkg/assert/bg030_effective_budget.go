package assert

import (
	"fmt"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleEffectiveBudget: a budget binds a route only if the gateway applies the
// budget policy to it. Envoy Gateway applies one BackendTrafficPolicy per
// route: the most specific one (route rule, route, listener, Gateway), and a
// Gateway-level policy only where nothing more specific set the route's
// traffic features (internal/gatewayapi/backendtrafficpolicy.go,
// translateBackendTrafficPolicyForListeners: "If any of the features are
// already set ... we skip it"). So a route-level policy written for a timeout
// or a retry drops every budget of the Gateway on its routes, unless it sets
// spec.mergeType: then EG merges it with the listener's or Gateway's policy
// (translateBackendTrafficPolicyForRouteWithMerge); StrategicMerge keeps the
// parent's rate limit rules (merged by rule name), JSONMerge replaces the rule
// list when the route policy has a global rate limit of its own (a JSON merge
// patch replaces lists). agentgateway merges traffic policies field by field with
// the more specific target winning (Gateway < listener < route < route rule;
// crates/agentgateway/src/store/binds.rs route_policies, store/policy.rs
// merge_with_inheritance): a route's AgentgatewayPolicy with a global rate
// limit replaces the Gateway's budgets on that route, unless the budget
// policy sets spec.strategy.inheritance: Override.
var ruleEffectiveBudget = &Rule{
	ID:       "BG030",
	Name:     "effective-budget",
	Doc:      "no more specific BackendTrafficPolicy (route, route rule, listener) or route-level AgentgatewayPolicy rate limit replaces a budget policy on any of its routes",
	Severity: Error,
	Check: func(p *Pass) error {
		for _, pol := range p.Index.BudgetPolicies() {
			_, lost := budgetReach(p.Index, pol.Obj)
			for _, at := range sortedAttachments(lost) {
				reportReplaced(p, pol.Obj, at, lost[at])
			}
		}
		checkAgentgatewayPrecedence(p)
		checkListenerSets(p)
		return nil
	},
}

// budgetReach splits the route units a budget policy targets into those
// Envoy Gateway applies its rules to and those another policy takes, by the
// attachment that takes them.
func budgetReach(ix *Index, pol *manifest.Object) (applied []routeUnit, lost map[*attachment][]routeUnit) {
	btp := ix.attachOf(kindBackendTrafficPolicy)
	lost = map[*attachment][]routeUnit{}
	seen := map[routeUnit]bool{}
	for _, at := range btp.winnersOf(pol) {
		for _, u := range ix.unitsOf(at) {
			if seen[u] {
				continue
			}
			seen[u] = true
			eff, parent := btp.effective(u)
			if eff == nil || eff.Policy == pol || keepsParentRules(eff, parent, pol) {
				applied = append(applied, u)
				continue
			}
			lost[eff] = append(lost[eff], u)
		}
	}
	return applied, lost
}

// keepsParentRules reports whether route policy eff, merged with parent,
// keeps the rate limit rules of pol: eff sets mergeType, pol is the parent,
// and the merge is strategic or eff has no global rate limit of its own. EG
// merges the two policies' IR rate limits, {global: {rules}, local}
// (translateBackendTrafficPolicyForRouteWithMerge); a JSON merge patch
// replaces the parent's global rule list only with a global one, and a route
// policy with a local limit alone leaves it (buildRateLimit builds no global
// limit for rateLimit.type Local either).
func keepsParentRules(eff, parent *attachment, pol *manifest.Object) bool {
	if eff.Merge == "" || parent == nil || parent.Policy != pol {
		return false
	}
	rl := manifest.Get(eff.Policy.Node, "spec", "rateLimit")
	ownGlobal := manifest.Get(rl, "global") != nil && manifest.Str(manifest.Get(rl, "type")) != "Local"
	return eff.Merge != "JSONMerge" || !ownGlobal
}

func sortedAttachments(m map[*attachment][]routeUnit) []*attachment {
	out := make([]*attachment, 0, len(m))
	for at := range m {
		out = append(out, at)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Policy.String() != out[j].Policy.String() {
			return out[i].Policy.String() < out[j].Policy.String()
		}
		return out[i].Path < out[j].Path
	})
	return out
}

// routeList names the routes of units, sorted, without repeats: a route
// whose every rule is among the units by its name, else each rule.
func routeList(units []routeUnit) string {
	rules := map[*xRoute]map[int]bool{}
	for _, u := range units {
		if rules[u.Route] == nil {
			rules[u.Route] = map[int]bool{}
		}
		rules[u.Route][u.Rule] = true
	}
	var out []string
	for rt, idx := range rules {
		if len(idx) == len(rt.Rules) {
			out = append(out, rt.String())
			continue
		}
		for i := range idx {
			name := rt.Rules[i]
			if name == "" {
				name = fmt.Sprintf("%d", i)
			}
			out = append(out, rt.String()+" rule "+name)
		}
	}
	return strings.Join(dedupe(out), ", ")
}

// reportReplaced reports, at the replacing policy's target, the routes it
// takes from budget policy pol.
func reportReplaced(p *Pass, pol *manifest.Object, at *attachment, units []routeUnit) {
	var why, fix string
	switch {
	case at.level == levelListener:
		why = "EG applies a listener's BackendTrafficPolicy instead of the Gateway's"
		fix = fmt.Sprintf("put %s's settings and the budgets in one policy (give it to budgetgen as spec.gateways[].basePolicy)", at.Policy.Name)
	case at.Merge == "JSONMerge":
		why = "its mergeType JSONMerge replaces the parent's list of rate limit rules with its own (a JSON merge patch replaces lists)"
		fix = "use mergeType: StrategicMerge, which keeps both policies' rules (merged by rule name)"
	case at.Merge != "":
		why = fmt.Sprintf("its mergeType merges it with the %s's policy, which is not the budget policy", parentScopeName(at))
		fix = "attach the budgets to the same scope as the policy it merges with"
	default:
		why = "EG applies the most specific BackendTrafficPolicy to a route, and this one has no mergeType"
		fix = fmt.Sprintf("set spec.mergeType: StrategicMerge on %s (EG then merges it with the budget policy and keeps its rules), or move its settings into the budget policy (spec.gateways[].basePolicy)", at.Policy.Name)
	}
	p.Report(at.Policy, at.Node, at.Path, "%s on %s replaces budget policy %s on %s: %s, so their requests are charged to no budget of %s; %s",
		at.Policy, at.Key, pol, routeList(units), why, pol.Name, fix)
}

func parentScopeName(at *attachment) string {
	if at.level == levelRule || at.level == levelRoute {
		return "listener (or Gateway)"
	}
	return "Gateway"
}

// checkAgentgatewayPrecedence reports AgentgatewayPolicies with a remote rate
// limit on routes of a Gateway whose budgets another AgentgatewayPolicy holds:
// on those routes agentgateway uses the route's rate limit instead.
func checkAgentgatewayPrecedence(p *Pass) {
	budgets := agentgatewayBudgetPolicies(p.Index)
	replacing := agentgatewayRemoteRateLimits(p.Index)
	for _, b := range budgets {
		if manifest.Str(manifest.Get(b.Node, "spec", "strategy", "inheritance")) == "Override" {
			continue // more specific policies cannot replace its rate limit
		}
		gws := agwGatewayTargets(p.Index, b)
		for _, q := range replacing {
			if q == b || q.Namespace == "" {
				continue
			}
			for _, r := range agwRouteTargets(p.Index, q) {
				routes := agwRoutesOn(p.Index, r.route, gws)
				if routes == "" {
					continue
				}
				p.Report(q, r.node, r.path, "%s's global rate limit on %s replaces the budgets of %s there (agentgateway merges traffic policies field by field and the route's wins: crates/agentgateway/src/store/binds.rs route_policies), so requests on %s are charged to no budget of %s; put the route's descriptors in %s, or set spec.strategy.inheritance: Override on %s",
					q, r.route, b, routes, b.Name, b.Name, b.Name)
			}
			checkAgwSharedTargets(p, b, gws, q)
		}
	}
}

// agwGatewayTargets lists the Gateways (and listener, as Section) an
// AgentgatewayPolicy targets: targetRefs of kind Gateway, and the Gateways of
// the input its targetSelectors select (same namespace, labels holding
// matchLabels).
func agwGatewayTargets(ix *Index, o *manifest.Object) []GatewayKey {
	var out []GatewayKey
	spec := manifest.Get(o.Node, "spec")
	for _, r := range manifest.Items(manifest.Get(spec, "targetRefs")) {
		if manifest.Str(manifest.Get(r, "kind")) == "Gateway" && manifest.Str(manifest.Get(r, "group")) == GroupGateway {
			out = append(out, GatewayKey{o.Namespace, manifest.Str(manifest.Get(r, "name")), manifest.Str(manifest.Get(r, "sectionName"))})
		}
	}
	for _, s := range manifest.Items(manifest.Get(spec, "targetSelectors")) {
		if manifest.Str(manifest.Get(s, "kind")) != "Gateway" || manifest.Str(manifest.Get(s, "group")) != GroupGateway {
			continue
		}
		for _, gw := range ix.Gateways {
			if gw.Namespace == o.Namespace && labelsHold(gw, manifest.Get(s, "matchLabels")) {
				out = append(out, GatewayKey{gw.Namespace, gw.Name, manifest.Str(manifest.Get(s, "sectionName"))})
			}
		}
	}
	return out
}

// labelsHold reports whether o's labels hold every key/value of want.
func labelsHold(o *manifest.Object, want *yaml.Node) bool {
	var m map[string]string
	if want == nil || want.Decode(&m) != nil || len(m) == 0 {
		return false
	}
	have := objectLabels(o)
	for k, v := range m {
		if have[k] != v {
			return false
		}
	}
	return true
}

type agwRouteTarget struct {
	route *xRoute
	node  *yaml.Node
	path  string
}

// agwRouteTargets lists the routes of the input an AgentgatewayPolicy's
// targetRefs name (HTTPRoute or GRPCRoute, with or without a rule) and its
// targetSelectors select (same namespace and kind, labels holding
// matchLabels): the controller attaches a selected route as a named one.
func agwRouteTargets(ix *Index, o *manifest.Object) []agwRouteTarget {
	var out []agwRouteTarget
	for i, r := range manifest.Items(manifest.Get(o.Node, "spec", "targetRefs")) {
		kind := manifest.Str(manifest.Get(r, "kind"))
		if kind != "HTTPRoute" && kind != "GRPCRoute" {
			continue
		}
		if rt := ix.xroute(kind, o.Namespace, manifest.Str(manifest.Get(r, "name"))); rt != nil {
			out = append(out, agwRouteTarget{route: rt, node: r, path: fmt.Sprintf("spec.targetRefs[%d]", i)})
		}
	}
	for i, s := range manifest.Items(manifest.Get(o.Node, "spec", "targetSelectors")) {
		kind := manifest.Str(manifest.Get(s, "kind"))
		if kind != "HTTPRoute" && kind != "GRPCRoute" || manifest.Str(manifest.Get(s, "group")) != GroupGateway {
			continue
		}
		for _, rt := range ix.allRoutes() {
			if rt.Kind == kind && !rt.Generated && rt.Obj.Namespace == o.Namespace && labelsHold(rt.Obj, manifest.Get(s, "matchLabels")) {
				out = append(out, agwRouteTarget{route: rt, node: s, path: fmt.Sprintf("spec.targetSelectors[%d]", i)})
			}
		}
	}
	return out
}

// agwRoutesOn names rt when it attaches to one of the Gateways (listeners)
// gws, directly or through a ListenerSet of the input, else "". A route on
// a ListenerSet's listener gets its Gateway's policies (route_policies in
// crates/agentgateway/src/store/binds.rs starts from the listener's Gateway),
// those of the whole Gateway only: a sectionName names a listener of the
// Gateway itself.
func agwRoutesOn(ix *Index, rt *xRoute, gws []GatewayKey) string {
	for _, parent := range rt.Parents {
		for _, g := range gws {
			if parent.Namespace != g.Namespace || parent.Name != g.Name {
				continue
			}
			if g.Section == "" || parent.Section == "" || parent.Section == g.Section {
				return rt.String()
			}
		}
	}
	for _, pr := range manifest.Items(manifest.Get(rt.Obj.Node, "spec", "parentRefs")) {
		if manifest.Str(manifest.Get(pr, "kind")) != "ListenerSet" {
			continue
		}
		ns := manifest.Str(manifest.Get(pr, "namespace"))
		if ns == "" {
			ns = rt.Obj.Namespace
		}
		if gw, ok := listenerSetParent(ix, ns, manifest.Str(manifest.Get(pr, "name")), GroupGateway); ok && agwWholeGateway(gws, gw) {
			return rt.String()
		}
	}
	return ""
}
