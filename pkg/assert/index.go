package assert

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/budgetgen/budgetgen/internal/aigateway"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// API groups the gate reads.
const (
	GroupEG      = "gateway.envoyproxy.io"
	GroupGateway = "gateway.networking.k8s.io"
)

// Index is the objects of a run, sorted into what the rules look at.
// Non-EG kinds are kept only where a rule needs them.
type Index struct {
	Objects          []*manifest.Object
	Policies         []*Policy // every BackendTrafficPolicy
	Gateways         []*manifest.Object
	Routes           []*manifest.Object // HTTPRoutes (and GRPCRoutes)
	SecurityPolicies []*manifest.Object
	ClientPolicies   []*manifest.Object // ClientTrafficPolicies
	Namespaces       map[string]*manifest.Object
	// SelectorErrors are targetSelectors found invalid while resolving targets.
	SelectorErrors []SelectorError

	// aiRoutes and aiConfigs are Envoy AI Gateway's AIGatewayRoutes and
	// GatewayConfigs (any served version), read into budgetgen's own model
	// of the few fields the rules check (internal/aigateway), which is not
	// part of this package's API.
	aiRoutes  []*aigateway.Route
	aiConfigs []*aigateway.GatewayConfig
	selectors map[*yaml.Node]labels.Selector // compiled selectors (nil: invalid)
	xroutes   []*xRoute                      // allRoutes, computed once
	units     []routeUnit                    // allUnits, computed once
	attach    map[string]*attachments        // Attach, per policy kind
	security  map[[2]*manifest.Object]securityResult
}

// RuleKind says what a global rate-limit rule is for.
type RuleKind int

// Kinds of rules.
const (
	// OtherRule is a plain request rate limit.
	OtherRule RuleKind = iota
	// TokenRule charges a cost after the response: a budget (tokens from
	// metadata, or anything else BG003 reports).
	TokenRule
	// KillSwitchRule is a request-count rule with limit 0 on the model header.
	KillSwitchRule
)

func (k RuleKind) String() string {
	switch k {
	case TokenRule:
		return "token rule"
	case KillSwitchRule:
		return "kill switch"
	}
	return "rule"
}

// Policy is a BackendTrafficPolicy with its global rules classified.
type Policy struct {
	Obj   *manifest.Object
	Rules []*RateRule
	// Budget is true for a budget policy: it carries the rule-budgets
	// annotation, or at least one token rule or kill switch.
	Budget bool
	// AnnotationErr is set when the rule-budgets annotation is present but
	// cannot be read; Annotation is its value node.
	AnnotationErr error
	Annotation    *yaml.Node
	// Created is metadata.creationTimestamp (zero when absent, as in most
	// committed manifests).
	Created time.Time
}

// RateRule is one entry of spec.rateLimit.global.rules.
type RateRule struct {
	Policy *Policy
	// Index is the rule's position (EG's rule/<i>).
	Index int
	Node  *yaml.Node
	Kind  RuleKind
	// Budget and Principal come from the rule-budgets annotation ("" when absent).
	Budget    string
	Principal string
	// Window ("" = day) and Measure ("" = tokens) come from the annotation
	// too: a budget's week, month or hour rule, or a rule charging token
	// units or money (see windows.go).
	Window  string
	Measure string

	headers []HeaderMatch // cached by Headers
}

// Path is the rule's field path.
func (r *RateRule) Path() string { return fmt.Sprintf("spec.rateLimit.global.rules[%d]", r.Index) }

// ID is EG's descriptor name of the rule when shared: <ns>/<policy>/rule/<i>.
func (r *RateRule) ID() string {
	return budgetmap.RuleDescriptor(r.Policy.Obj.Namespace+"/"+r.Policy.Obj.Name, r.Index)
}

// HeaderMatch is one clientSelectors[s].headers[h] entry.
type HeaderMatch struct {
	Node     *yaml.Node
	Path     string
	Selector int
	Name     string // lowercased
	Type     string // Exact (default), RegularExpression, Distinct
	Value    string
	HasValue bool
	Invert   bool
}

// Headers lists the rule's header matches across its selectors (computed
// once: BG009 compares every pair of rules).
func (r *RateRule) Headers() []HeaderMatch {
	if r.headers == nil {
		r.headers = r.readHeaders()
	}
	return r.headers
}

func (r *RateRule) readHeaders() []HeaderMatch {
	out := []HeaderMatch{}
	for s, sel := range manifest.Items(manifest.Get(r.Node, "clientSelectors")) {
		for h, hm := range manifest.Items(manifest.Get(sel, "headers")) {
			m := HeaderMatch{
				Node:     hm,
				Path:     fmt.Sprintf("%s.clientSelectors[%d].headers[%d]", r.Path(), s, h),
				Selector: s,
				Name:     strings.ToLower(manifest.Str(manifest.Get(hm, "name"))),
				Type:     manifest.Str(manifest.Get(hm, "type")),
			}
			if m.Type == "" {
				m.Type = "Exact"
			}
			if v := manifest.Get(hm, "value"); v != nil {
				m.Value, m.HasValue = manifest.Str(v), true
			}
			m.Invert, _ = manifest.Bool(manifest.Get(hm, "invert"))
			out = append(out, m)
		}
	}
	return out
}

type ruleBudget struct {
	Rule      int    `json:"rule"`
	Budget    string `json:"budget"`
	Kind      string `json:"kind"`
	Principal string `json:"principal"`
	Window    string `json:"window"`
	Measure   string `json:"measure"`
}

// NewIndex sorts objs into an Index and classifies every BTP's rules.
func NewIndex(objs []*manifest.Object) *Index {
	ix := &Index{Objects: objs, Namespaces: map[string]*manifest.Object{}, selectors: map[*yaml.Node]labels.Selector{}, attach: map[string]*attachments{}}
	for _, o := range objs {
		switch {
		case o.Group() == GroupEG && o.Kind == "BackendTrafficPolicy":
			ix.Policies = append(ix.Policies, newPolicy(o))
		case o.Group() == GroupEG && o.Kind == "SecurityPolicy":
			ix.SecurityPolicies = append(ix.SecurityPolicies, o)
		case o.Group() == GroupEG && o.Kind == "ClientTrafficPolicy":
			ix.ClientPolicies = append(ix.ClientPolicies, o)
		case o.Group() == GroupGateway && o.Kind == "Gateway":
			ix.Gateways = append(ix.Gateways, o)
		case o.Group() == GroupGateway && (o.Kind == "HTTPRoute" || o.Kind == "GRPCRoute"):
			ix.Routes = append(ix.Routes, o)
		case o.Group() == "" && o.Kind == "Namespace":
			ix.Namespaces[o.Name] = o
		case o.Group() == aigateway.Group && o.Kind == aigateway.KindRoute:
			ix.aiRoutes = append(ix.aiRoutes, aigateway.ReadRoute(o))
		case o.Group() == aigateway.Group && o.Kind == aigateway.KindGatewayConfig:
			ix.aiConfigs = append(ix.aiConfigs, aigateway.ReadGatewayConfig(o))
		}
	}
	return ix
}

func newPolicy(o *manifest.Object) *Policy {
	p := &Policy{Obj: o}
	if ts := manifest.Str(manifest.Get(o.Node, "metadata", "creationTimestamp")); ts != "" {
		p.Created, _ = time.Parse(time.RFC3339, ts)
	}
	byRule := map[int]ruleBudget{}
	if a := manifest.Get(o.Node, "metadata", "annotations", RuleBudgetsAnnotation); a != nil {
		p.Budget = true
		p.Annotation = a
		var rbs []ruleBudget
		if err := json.Unmarshal([]byte(manifest.Str(a)), &rbs); err != nil {
			p.AnnotationErr = err
		}
		for _, rb := range rbs {
			byRule[rb.Rule] = rb
		}
	}
	for i, n := range manifest.Items(manifest.Get(o.Node, "spec", "rateLimit", "global", "rules")) {
		r := &RateRule{Policy: p, Index: i, Node: n, Kind: classify(n)}
		if rb, ok := byRule[i]; ok {
			r.Budget, r.Principal, r.Window, r.Measure = rb.Budget, rb.Principal, rb.Window, rb.Measure
			switch rb.Kind {
			case budgetmap.KindTokens:
				r.Kind = TokenRule
			case budgetmap.KindKillSwitch:
				r.Kind = KillSwitchRule
			}
		}
		if r.Kind != OtherRule {
			p.Budget = true
		}
		p.Rules = append(p.Rules, r)
	}
	return p
}

// classify recognises hand-written budget rules (docs/assert.md):
//   - a token rule charges cost.response (from Metadata, any namespace/key,
//     or from Number: BG003 then reports what is not the token count);
//   - a kill switch has limit.requests 0, no response cost, and a header
//     match on the model header (x-ai-eg-model).
func classify(n *yaml.Node) RuleKind {
	if manifest.Get(n, "cost", "response") != nil {
		return TokenRule
	}
	if req, ok := manifest.Int(manifest.Get(n, "limit", "requests")); ok && req == 0 && manifest.Get(n, "cost", "response") == nil {
		for _, sel := range manifest.Items(manifest.Get(n, "clientSelectors")) {
			for _, hm := range manifest.Items(manifest.Get(sel, "headers")) {
				if strings.EqualFold(manifest.Str(manifest.Get(hm, "name")), DefaultModelHeader) {
					return KillSwitchRule
				}
			}
		}
	}
	return OtherRule
}

// GatewayKey names a Gateway, optionally one listener.
type GatewayKey struct {
	Namespace, Name, Section string
}

func (k GatewayKey) String() string {
	s := "Gateway " + k.Namespace + "/" + k.Name
	if k.Section != "" {
		s += " section " + k.Section
	}
	return s
}

// Target is a resolved Gateway target of a policy and the node that selects it.
type Target struct {
	Gateway GatewayKey
	Node    *yaml.Node
	Path    string
	// Via is the HTTPRoute through which a route-level policy reaches the Gateway ("" when direct).
	Via string
}

// Targets resolves obj's targetRef, targetRefs and targetSelectors of kind
// Gateway (directly) and HTTPRoute/GRPCRoute (through the routes' parentRefs)
// against the objects in the index. Sorted, without duplicates.
func (ix *Index) Targets(obj *manifest.Object) []Target {
	var ts targetSet
	spec := manifest.Get(obj.Node, "spec")
	ix.refTargets(obj, spec, &ts)
	ix.selectorTargets(obj, spec, &ts)
	return ts.sorted()
}

// targetSet collects the targets of one policy: one per Gateway (and
// listener) and route it is reached through.
type targetSet []Target

func (ts *targetSet) add(t Target) {
	for _, o := range *ts {
		if o.Gateway == t.Gateway && o.Via == t.Via {
			return
		}
	}
	*ts = append(*ts, t)
}

func (ts targetSet) sorted() []Target {
	out := []Target(ts)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].Gateway, out[j].Gateway
		if a != b {
			return a.Namespace+"/"+a.Name+"/"+a.Section < b.Namespace+"/"+b.Name+"/"+b.Section
		}
		return out[i].Via < out[j].Via
	})
	return out
}

// refTargets resolves spec.targetRef, or else spec.targetRefs.
func (ix *Index) refTargets(obj *manifest.Object, spec *yaml.Node, ts *targetSet) {
	refs, paths := targetRefNodes(spec)
	for i, ref := range refs {
		group := manifest.Str(manifest.Get(ref, "group"))
		if group != "" && group != GroupGateway {
			continue
		}
		name := manifest.Str(manifest.Get(ref, "name"))
		switch kind := manifest.Str(manifest.Get(ref, "kind")); kind {
		case "Gateway":
			ts.add(Target{Gateway: GatewayKey{obj.Namespace, name, manifest.Str(manifest.Get(ref, "sectionName"))}, Node: ref, Path: paths[i]})
		case "HTTPRoute", "GRPCRoute":
			ix.routeRefTargets(obj, ref, paths[i], kind, name, ts)
		}
	}
}

// routeRefTargets resolves a targetRef naming a route: the Gateways of the
// route of the input with that name, or, for an HTTPRoute the input does not
// hold, those of the AIGatewayRoute Envoy AI Gateway generates it from.
func (ix *Index) routeRefTargets(obj *manifest.Object, ref *yaml.Node, path, kind, name string, ts *targetSet) {
	found := false
	for _, rt := range ix.Routes {
		if rt.Namespace == obj.Namespace && rt.Name == name {
			found = true
			for _, gk := range routeParents(rt) {
				ts.add(Target{Gateway: gk, Node: ref, Path: path, Via: rt.Namespace + "/" + rt.Name})
			}
		}
	}
	if found || kind != "HTTPRoute" {
		return
	}
	// Envoy AI Gateway generates an HTTPRoute of the same name from
	// each AIGatewayRoute (its docs attach BackendTrafficPolicies to it).
	for _, ar := range ix.aiRoutes {
		if ar.Obj.Namespace == obj.Namespace && ar.Obj.Name == name {
			for _, pr := range ar.Parents {
				ts.add(Target{Gateway: GatewayKey{Namespace: pr.Namespace, Name: pr.Name}, Node: ref, Path: path, Via: ar.Obj.Namespace + "/" + ar.Obj.Name})
			}
		}
	}
}

// selectorTargets resolves spec.targetSelectors against the Gateways and
// routes of the input.
func (ix *Index) selectorTargets(obj *manifest.Object, spec *yaml.Node, ts *targetSet) {
	for i, sel := range manifest.Items(manifest.Get(spec, "targetSelectors")) {
		path := fmt.Sprintf("spec.targetSelectors[%d]", i)
		group := manifest.Str(manifest.Get(sel, "group"))
		if group != "" && group != GroupGateway {
			continue
		}
		switch manifest.Str(manifest.Get(sel, "kind")) {
		case "Gateway":
			for _, gw := range ix.Gateways {
				if ix.selects(obj, sel, path, gw) {
					ts.add(Target{Gateway: GatewayKey{gw.Namespace, gw.Name, ""}, Node: sel, Path: path})
				}
			}
		case "HTTPRoute", "GRPCRoute":
			for _, rt := range ix.Routes {
				if ix.selects(obj, sel, path, rt) {
					for _, gk := range routeParents(rt) {
						ts.add(Target{Gateway: gk, Node: sel, Path: path, Via: rt.Namespace + "/" + rt.Name})
					}
				}
			}
		}
	}
}

// routeParents lists the Gateways a route attaches to (parentRefs of kind
// Gateway, the default kind; namespace defaults to the route's).
func routeParents(rt *manifest.Object) []GatewayKey {
	var out []GatewayKey
	for _, pr := range manifest.Items(manifest.Get(rt.Node, "spec", "parentRefs")) {
		if k := manifest.Str(manifest.Get(pr, "kind")); k != "" && k != "Gateway" {
			continue
		}
		ns := manifest.Str(manifest.Get(pr, "namespace"))
		if ns == "" {
			ns = rt.Namespace
		}
		out = append(out, GatewayKey{Namespace: ns, Name: manifest.Str(manifest.Get(pr, "name"))})
	}
	return out
}

// selects applies a targetSelector (namespaces, matchLabels, matchExpressions)
// of policy obj to a candidate target, with apimachinery's label selector
// semantics. A selector apimachinery refuses (an unknown operator, In with no
// values) selects nothing and is recorded in SelectorErrors, so a rule can
// report it instead of the policy silently reaching no target.
func (ix *Index) selects(obj *manifest.Object, sel *yaml.Node, path string, target *manifest.Object) bool {
	return ix.selectsIgnoringGrants(obj, sel, path, target) && ix.crossNamespaceGranted(obj, target)
}

// selectsIgnoringGrants is selects without the ReferenceGrant check.
func (ix *Index) selectsIgnoringGrants(obj *manifest.Object, sel *yaml.Node, path string, target *manifest.Object) bool {
	switch from := manifest.Str(manifest.Get(sel, "namespaces", "from")); from {
	case "", "Same":
		if target.Namespace != obj.Namespace {
			return false
		}
	case "All":
	case "Selector":
		nsSel, ok := ix.selector(obj, manifest.Get(sel, "namespaces", "selector"), path+".namespaces.selector")
		ns, found := ix.Namespaces[target.Namespace]
		if !ok || !found || !nsSel.Matches(objectLabels(ns)) {
			return false
		}
	default:
		ix.selectorError(obj, manifest.Get(sel, "namespaces", "from"), path+".namespaces.from", fmt.Errorf("namespaces.from %q is not Same, All or Selector", from))
		return false
	}
	s, ok := ix.selector(obj, sel, path)
	return ok && s.Matches(objectLabels(target))
}

// crossNamespaceGranted reports whether Envoy Gateway keeps a target a
// selector of policy obj found in another namespace: only when a
// ReferenceGrant (gateway.networking.k8s.io, any version) in the target's
// namespace has a from entry for the policy's group, kind and namespace and a
// to entry for the target's group and kind, with its name or none
// (internal/gatewayapi/helpers.go of EG v1.9.1, resolvePolicyTargetsFromSelectors
// and isCrossNamespaceReferencePermitted). A grant applied from elsewhere is
// not seen: the gate fails closed, as for Namespace selectors.
func (ix *Index) crossNamespaceGranted(obj, target *manifest.Object) bool {
	if obj.Namespace == target.Namespace {
		return true
	}
	for _, g := range ix.Objects {
		if g.Kind != "ReferenceGrant" || g.Group() != GroupGateway || g.Namespace != target.Namespace {
			continue
		}
		fromOK, toOK := false, false
		for _, f := range manifest.Items(manifest.Get(g.Node, "spec", "from")) {
			fromOK = fromOK || manifest.Str(manifest.Get(f, "group")) == obj.Group() &&
				manifest.Str(manifest.Get(f, "kind")) == obj.Kind && manifest.Str(manifest.Get(f, "namespace")) == obj.Namespace
		}
		for _, t := range manifest.Items(manifest.Get(g.Node, "spec", "to")) {
			name := manifest.Str(manifest.Get(t, "name"))
			toOK = toOK || manifest.Str(manifest.Get(t, "group")) == target.Group() &&
				manifest.Str(manifest.Get(t, "kind")) == target.Kind && (name == "" || name == target.Name)
		}
		if fromOK && toOK {
			return true
		}
	}
	return false
}

// selector compiles the matchLabels/matchExpressions of n once per node.
func (ix *Index) selector(obj *manifest.Object, n *yaml.Node, path string) (labels.Selector, bool) {
	if c, ok := ix.selectors[n]; ok {
		return c, c != nil
	}
	var ls metav1.LabelSelector
	var err error
	if n != nil {
		var raw any
		if err = n.Decode(&raw); err == nil {
			var j []byte
			if j, err = json.Marshal(raw); err == nil {
				// Lenient: a targetSelector also holds group, kind and namespaces.
				err = json.Unmarshal(j, &ls)
			}
		}
	}
	var s labels.Selector
	if err == nil {
		s, err = metav1.LabelSelectorAsSelector(&ls)
	}
	if err != nil {
		ix.selectorError(obj, n, path, err)
		ix.selectors[n] = nil
		return nil, false
	}
	ix.selectors[n] = s
	return s, true
}

func (ix *Index) selectorError(obj *manifest.Object, n *yaml.Node, path string, err error) {
	for _, e := range ix.SelectorErrors {
		if e.Node == n && e.Path == path {
			return
		}
	}
	ix.SelectorErrors = append(ix.SelectorErrors, SelectorError{Obj: obj, Node: n, Path: path, Err: err})
}

// SelectorError is a targetSelector that is not a valid label selector.
type SelectorError struct {
	Obj  *manifest.Object
	Node *yaml.Node
	Path string
	Err  error
}

func objectLabels(o *manifest.Object) labels.Set {
	out := labels.Set{}
	keys, vals := manifest.Pairs(manifest.Get(o.Node, "metadata", "labels"))
	for i := range keys {
		out[keys[i].Value] = manifest.Str(vals[i])
	}
	return out
}

// BudgetPolicies returns the budget policies.
func (ix *Index) BudgetPolicies() []*Policy {
	var out []*Policy
	for _, p := range ix.Policies {
		if p.Budget {
			out = append(out, p)
		}
	}
	return out
}
