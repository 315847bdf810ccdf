package assert

import (
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
	"k8s.io/apimachinery/pkg/labels"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleAgentgateway checks the budgets enforced by agentgateway's
// AgentgatewayPolicy (agentgateway.dev): its global rate limit must say how it
// fails (the CRD defaults to FailClosed: a rate limit outage would answer 500
// to every request), count token budgets in Tokens, take every descriptor
// value from the verified JWT (jwt.* in CEL) rather than from anything the
// client sends, attach one rate limit policy per target, keep the schema
// rules of the CRD, and, with --spec, name only budgets of the spec. Caps
// and shadow/enforce live in the rate limit service's config for the
// policy's domain (budgetgen render --ratelimit-config), not in the policy:
// with --spec, that config (when in the input) must have a limit for every
// budget of the policy, in the mode the spec gives it.
var ruleAgentgateway = &Rule{
	ID:       "BG020",
	Name:     "agentgateway",
	Doc:      "AgentgatewayPolicy global rate limits: explicit failureMode, unit Tokens for token budgets, principals only from the verified JWT, one policy per target, valid against the CRD's schema rules, budgets known to the spec, and (with --spec) the rate limit config of its domain in the spec's shadow/enforce mode",
	Severity: Error,
	Check: func(p *Pass) error {
		targets := map[string][]agwTarget{}
		configs := rateLimitConfigs(p.Index.Objects)
		for _, o := range p.Index.Objects {
			if o.Kind != agentgateway.KindPolicy || o.Group() != agentgateway.Group {
				continue
			}
			global := manifest.Get(o.Node, "spec", "traffic", "rateLimit", "global")
			if global == nil {
				if conditionalGlobal(o) {
					checkConditionalTargets(p, o, targets)
				}
				continue
			}
			if pol := checkAgentgatewayPolicy(p, o, global, targets); pol != nil && p.Options.Spec != nil {
				checkAgentgatewayModes(p, o, pol.Spec.Traffic.RateLimit.Global, configs)
			}
		}
		return nil
	},
}

// agwTarget is a Gateway (or another target) one rate limit policy attaches to.
type agwTarget struct {
	section string // "" for the whole Gateway
	policy  *manifest.Object
}

const agwGlobalPath = "spec.traffic.rateLimit.global"

// checkAgentgatewayPolicy checks one policy's global rate limit and returns
// the decoded policy (nil when it does not decode).
func checkAgentgatewayPolicy(p *Pass, o *manifest.Object, global *yaml.Node, targets map[string][]agwTarget) *agentgateway.Policy {
	// The modelled types carry JSON tags (the Kubernetes convention).
	var pol agentgateway.Policy
	raw, err := yaml.Marshal(o.Node)
	if err == nil {
		err = sigsyaml.Unmarshal(raw, &pol)
	}
	if err != nil || pol.Spec.Traffic == nil || pol.Spec.Traffic.RateLimit == nil || pol.Spec.Traffic.RateLimit.Global == nil {
		p.Report(o, global, agwGlobalPath, "the global rate limit does not decode (%v): it cannot be checked", err)
		return nil
	}
	for _, fe := range agentgateway.Validate(&pol) {
		p.Report(o, NodeAt(o.Node, fe.Path), fe.Path, "%s (AgentgatewayPolicy CRD schema)", fe.Msg)
	}
	checkAgwTargets(p, o, &pol, targets)
	g := pol.Spec.Traffic.RateLimit.Global
	if g.FailureMode == "" {
		p.Report(o, global, agwGlobalPath+".failureMode", "failureMode is not set, and the CRD defaults to FailClosed (a 500 for every request while the rate limit service is unreachable): set FailOpen (budgetgen's choice) or FailClosed explicitly")
	}
	if br := g.BackendRef; br != nil && br.Namespace != "" && br.Namespace != o.Namespace && !referenceGranted(p.Index, o.Namespace, br) {
		bp := agwGlobalPath + ".backendRef.namespace"
		p.ReportSeverity(Warning, o, NodeAt(o.Node, bp), bp,
			"the rate limit Service %s/%s is in another namespace and no ReferenceGrant in the input lets AgentgatewayPolicies of namespace %s reach it: an agentgateway controller in backend reference grant mode route-and-policy accepts this policy as PartiallyValid with no target, and FailOpen then admits every request unlimited (budgetgen render writes the grant; check it is applied if it lives elsewhere)",
			br.Namespace, br.Name, o.Namespace)
	}
	for i, d := range g.Descriptors {
		checkAgwDescriptor(p, o, fmt.Sprintf("%s.descriptors[%d]", agwGlobalPath, i), d)
	}
	return &pol
}

// checkConditionalTargets counts the targets of a policy whose global rate
// limits are conditional (rateLimit.conditional[].policy.global): the
// controller makes them one remote rate limit policy with conditions
// (processConditionalEntries in
// controller/pkg/agentgateway/plugins/traffic_plugin.go), and agentgateway
// keeps one remote rate limit per request (crates/agentgateway/src/store/binds.rs
// route_policies), so on a shared target it replaces the budgets, or they
// replace it, even on requests none of its conditions match.
func checkConditionalTargets(p *Pass, o *manifest.Object, targets map[string][]agwTarget) {
	var pol agentgateway.Policy
	raw, err := yaml.Marshal(o.Node)
	if err == nil {
		err = sigsyaml.Unmarshal(raw, &pol)
	}
	if err != nil {
		p.Report(o, manifest.Get(o.Node, "spec"), "spec", "the policy does not decode (%v): its targets cannot be checked", err)
		return
	}
	checkAgwTargets(p, o, &pol, targets)
}

// checkAgwTargets keeps one rate limit policy per target: two on the same
// Gateway overlap when they name the same listener, or when one names the
// whole Gateway (its limit then applies to every listener, the other's too).
// targets collects the policies seen so far, across the run.
func checkAgwTargets(p *Pass, o *manifest.Object, pol *agentgateway.Policy, targets map[string][]agwTarget) {
	for _, ref := range agwRefs(p, o, pol) {
		id := fmt.Sprintf("%s/%s/%s/%s", o.Namespace, ref.group, ref.kind, ref.name)
		reported := false
		for _, prev := range targets[id] {
			if prev.policy == o || (prev.section != "" && ref.section != "" && prev.section != ref.section) {
				continue
			}
			where := ref.kind + " " + ref.name
			if ref.selected {
				where += " (selected by " + ref.path + ")"
			}
			switch {
			case prev.section == ref.section && ref.section != "":
				where += " section " + ref.section
			case prev.section == "" && ref.section != "":
				where += " (section " + ref.section + ", inside the whole-Gateway target)"
			case prev.section != "" && ref.section == "":
				where += " (the whole Gateway, which holds section " + prev.section + ")"
			}
			p.Report(o, NodeAt(o.Node, ref.path), ref.path, "%s is already the target of the global rate limit of %s: agentgateway merges policies per target, so keep one rate limit policy per target", where, prev.policy)
			reported = true
			break
		}
		if !reported {
			targets[id] = append(targets[id], agwTarget{section: ref.section, policy: o})
		}
	}
}

// checkAgwDescriptor checks one descriptor at path dp: a token budget's
// counts Tokens, every entry reads only the verified JWT, and (with --spec)
// the budget it names is the spec's.
func checkAgwDescriptor(p *Pass, o *manifest.Object, dp string, d agentgateway.Descriptor) {
	budget := ""
	for _, e := range d.Entries {
		if e.Name == "budget" {
			budget = e.Expression
		}
	}
	if budget != "" && d.Unit != agentgateway.UnitTokens {
		p.Report(o, NodeAt(o.Node, dp), dp+".unit", "descriptor of token budget %s counts %s: set unit: Tokens, or each request counts 1 instead of its tokens", budget, unitOrDefault(d.Unit))
	}
	for j, e := range d.Entries {
		ep := fmt.Sprintf("%s.entries[%d].expression", dp, j)
		vars, err := agentgateway.Variables(e.Expression)
		if err != nil {
			continue // reported by the schema check
		}
		if bad := slices.DeleteFunc(vars, func(v string) bool { return v == "jwt" }); len(bad) > 0 {
			p.Report(o, NodeAt(o.Node, ep), ep, "descriptor entry %q reads %v: a principal must come from the verified JWT (jwt[...]) only, never from what the client sends", e.Name, bad)
			continue
		}
		if fns, err := agentgateway.Functions(e.Expression); err == nil {
			if bad := slices.DeleteFunc(fns, pureFunction); len(bad) > 0 {
				p.Report(o, NodeAt(o.Node, ep), ep, "descriptor entry %q calls %v, so its value need not come from the verified JWT: variables() returns every attribute, the request's headers included (crates/agentgateway/src/cel/mod.rs, new_strict), a custom function from the proxy's config can read any variable (crates/agentgateway/src/cel/custom.rs), uuid() and random() give each request a bucket of its own and fail() drops the descriptor (crates/celx/src/general.rs); build it from jwt[...], literals, coalesce, default and string() only",
					e.Name, bad)
			}
		}
	}
	if budget != "" && p.Options.Spec != nil && p.Options.Spec.Budgets != nil {
		name, ok := celLiteral(budget)
		if ok && !p.Options.Spec.Budgets[name] {
			p.Report(o, NodeAt(o.Node, dp), dp, "descriptor names budget %q, which is not in the spec: render again", name)
		}
	}
}

// agwRef is one object a policy attaches to: a targetRef, or an object of
// the input that a targetSelector selects.
type agwRef struct {
	path                       string // the spec.targetRefs or spec.targetSelectors entry
	group, kind, name, section string
	selected                   bool // by a targetSelector
}

// agwRefs lists the objects pol attaches to. A targetSelector selects the
// objects of its group and kind in the policy's namespace whose labels hold
// its matchLabels, among the objects of the input only; one that selects
// none is an error (its budgets bind nowhere the gate can see), and so is a
// targetRef whose sectionName names no listener of a Gateway of the input.
func agwRefs(p *Pass, o *manifest.Object, pol *agentgateway.Policy) []agwRef {
	var out []agwRef
	for i, r := range pol.Spec.TargetRefs {
		path := fmt.Sprintf("spec.targetRefs[%d]", i)
		if r.Kind == "Gateway" && r.SectionName != "" && !p.Index.hasListener(GatewayKey{Namespace: o.Namespace, Name: r.Name}, r.SectionName) {
			ls, _ := p.Index.listeners(GatewayKey{Namespace: o.Namespace, Name: r.Name})
			p.Report(o, NodeAt(o.Node, path+".sectionName"), path+".sectionName", "sectionName %q names no listener of Gateway %s/%s (listeners: %v): the policy binds nothing there; name one of the listeners, or drop sectionName for the whole Gateway", r.SectionName, o.Namespace, r.Name, ls)
			continue
		}
		out = append(out, agwRef{path: path, group: r.Group, kind: r.Kind, name: r.Name, section: r.SectionName})
	}
	for i, ts := range pol.Spec.TargetSelectors {
		path := fmt.Sprintf("spec.targetSelectors[%d]", i)
		node := NodeAt(o.Node, path)
		sel, err := labels.ValidatedSelectorFromSet(ts.MatchLabels)
		if err != nil {
			p.Report(o, node, path+".matchLabels", "not a valid label selector, so it selects nothing: %v", err)
			continue
		}
		n := 0
		for _, t := range p.Index.Objects {
			if t.Kind == ts.Kind && t.Group() == ts.Group && t.Namespace == o.Namespace && sel.Matches(objectLabels(t)) {
				out = append(out, agwRef{path: path, group: ts.Group, kind: ts.Kind, name: t.Name, section: ts.SectionName, selected: true})
				n++
			}
		}
		if n == 0 {
			// A gate fails closed: budgets that bind nowhere in sight are an error.
			p.Report(o, node, path, "selects no %s of namespace %s in the input (matchLabels %v): its budgets bind nowhere the gate can see; pass the Gateways, or use targetRefs", ts.Kind, o.Namespace, sel)
		}
	}
	return out
}

// pureFunctions are the functions a descriptor entry may call: their value
// comes from their arguments alone (agentgateway's coalesce and default,
// crates/celx/src/general.rs; CEL's conversions and string tests,
// crates/cel-fork/cel/src/functions.rs).
var pureFunctions = map[string]bool{
	"coalesce": true, "default": true, "string": true, "int": true, "uint": true, "double": true, "bool": true, "bytes": true,
	"size": true, "contains": true, "startsWith": true, "endsWith": true, "matches": true, "lowerAscii": true, "upperAscii": true,
}

// pureFunction reports whether an entry may call fn: one of pureFunctions, or
// a CEL operator (_+_, _[_], !_, -_, @in, ...).
func pureFunction(fn string) bool {
	return pureFunctions[fn] || strings.HasPrefix(fn, "_") || strings.HasPrefix(fn, "!") || strings.HasPrefix(fn, "-") || strings.HasPrefix(fn, "@")
}

func unitOrDefault(u string) string {
	if u == "" {
		return agentgateway.UnitRequests + " (the default)"
	}
	return u
}

// celLiteral returns the value of a CEL string literal expression.
func celLiteral(expr string) (string, bool) {
	var s string
	if err := yaml.Unmarshal([]byte(expr), &s); err != nil || len(expr) < 2 || expr[0] != '"' {
		return "", false
	}
	return s, true
}

// referenceGranted reports whether a ReferenceGrant (gateway.networking.k8s.io,
// any version) in the Service's namespace lets AgentgatewayPolicies of
// namespace from reach the Service br names: a from entry for that group,
// kind and namespace, and a to entry for core Services with that name or no
// name (every Service).
func referenceGranted(ix *Index, from string, br *agentgateway.BackendRef) bool {
	if br.Kind != "" && br.Kind != "Service" || br.Group != nil && *br.Group != "" {
		return true // not a core Service: outside this check
	}
	for _, g := range ix.Objects {
		if g.Kind != "ReferenceGrant" || g.Group() != GroupGateway || g.Namespace != br.Namespace {
			continue
		}
		fromOK := slices.ContainsFunc(manifest.Items(manifest.Get(g.Node, "spec", "from")), func(f *yaml.Node) bool {
			return manifest.Str(manifest.Get(f, "group")) == agentgateway.Group && manifest.Str(manifest.Get(f, "kind")) == agentgateway.KindPolicy &&
				manifest.Str(manifest.Get(f, "namespace")) == from
		})
		toOK := slices.ContainsFunc(manifest.Items(manifest.Get(g.Node, "spec", "to")), func(t *yaml.Node) bool {
			name := manifest.Get(t, "name")
			return manifest.Str(manifest.Get(t, "group")) == "" && manifest.Str(manifest.Get(t, "kind")) == "Service" &&
				(name == nil || manifest.Str(name) == br.Name)
		})
		if fromOK && toOK {
			return true
		}
	}
	return false
}
