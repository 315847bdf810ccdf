// Package render turns a BudgetSet into the Envoy Gateway objects that enforce
// it: exactly one BackendTrafficPolicy per target Gateway holding every budget
// as a global rate limit rule, and a ClientTrafficPolicy per Gateway stripping
// client-sent copies of the identity headers. Objects are built from Envoy
// Gateway's typed API, never from text templates, and every list that reaches
// the output is in a deterministic order.
package render

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/internal/aigateway"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// Envoy Gateway v1.9.1 limits (api/v1alpha1/ratelimit_types.go, shared_types.go).
const (
	MaxRulesPerPolicy      = 256  // spec.rateLimit.global.rules maxItems
	MaxSelectorsPerRule    = 8    // clientSelectors maxItems
	MaxHeadersPerSelector  = 128  // clientSelectors[].headers maxItems
	MaxHeaderValueLength   = 1024 // headers[].value maxLength
	MaxEarlyHeadersRemoved = 64   // headers.earlyRequestHeaders.remove maxItems
	// MaxOverridesPerBudget is how many principals one Distinct rule can exclude:
	// all selectors of a rule are ANDed, the first one also holds the Distinct match.
	MaxOverridesPerBudget = MaxSelectorsPerRule*MaxHeadersPerSelector - 1
)

// Labels and annotations budgetgen leaves on what it renders.
const (
	LabelManagedBy        = "app.kubernetes.io/managed-by"
	ManagedByValue        = "budgetgen"
	LabelBudgetSet        = "budgetgen.dev/budget-set"
	AnnotationRuleBudgets = "budgetgen.dev/rule-budgets"
)

// Object is one rendered Kubernetes object.
type Object struct {
	Kind      string
	Namespace string
	Name      string
	// Object is the value the manifest was encoded from: Envoy Gateway's
	// typed API (*egv1a1.BackendTrafficPolicy, *egv1a1.ClientTrafficPolicy),
	// Gateway API's (*gwapiv1b1.ReferenceGrant), or, for kinds whose projects
	// publish no Go API module (agentgateway's AgentgatewayPolicy, Envoy AI
	// Gateway's GatewayConfig), *unstructured.Unstructured decoded from
	// Manifest.
	Object any
	// Manifest is the object's YAML: apiVersion/kind first-level keys sorted,
	// no status, no empty creationTimestamp.
	Manifest []byte
}

// Result is everything rendered from one BudgetSet, in output order: per
// Gateway (spec order) its BackendTrafficPolicy then its ClientTrafficPolicy.
type Result struct {
	Objects []Object
	// AgentgatewayConfigs is the rate limit service config of every
	// agentgateway Gateway's domain (AgentgatewayConfigs): agentgateway sends
	// descriptors only, so its caps live in the service's files.
	AgentgatewayConfigs []*rlsconfv3.RateLimitConfig
	// LLMRequestCosts are the Envoy AI Gateway cost entries the rules charge
	// (caps past uint32, cost limits), sorted by key; empty for plain token
	// caps. List them in the GatewayConfig's globalLLMRequestCosts (or every
	// AIGatewayRoute's llmRequestCosts) of the Gateways.
	LLMRequestCosts []CostEntry
}

// LimitError is a spec that Envoy Gateway cannot express in one policy.
type LimitError struct {
	Limit  string // which EG limit, e.g. "256 rules per BackendTrafficPolicy"
	Object string // namespace/name of the policy, or the budget's field path
	Need   int
	Max    int
	Hint   string // what to do instead
	// Field is the spec field that asks for too much; File and Line locate
	// it, set by Render for a spec loaded from YAML.
	Field string
	File  string
	Line  int
}

func (e *LimitError) Error() string {
	msg := fmt.Sprintf("%s: needs %d, Envoy Gateway allows %s (max %d): %s", e.Object, e.Need, e.Limit, e.Max, e.Hint)
	if e.File != "" && e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, msg)
	}
	return msg
}

// Render builds the objects for a loaded (defaulted, validated) BudgetSet.
// It checks Envoy Gateway's limits before building anything, so an oversized
// spec fails fast.
func Render(bs *spec.BudgetSet) (*Result, error) {
	if err := checkLimits(bs); err != nil {
		return nil, positioned(bs, err)
	}
	if err := checkAgentgatewayCaps(bs); err != nil {
		return nil, positioned(bs, err)
	}
	costs, err := LLMRequestCosts(bs)
	if err != nil {
		return nil, err
	}
	res := &Result{LLMRequestCosts: costs}
	seenConfig := map[string]bool{}
	domains := map[string]int{}
	for i, gw := range bs.Spec.Gateways {
		if gw.IsAgentgateway() {
			if err := claimDomain(bs, domains, i, AgentgatewayDomain(bs, gw)); err != nil {
				return nil, err
			}
			o, err := agentgatewayObject(bs, gw)
			if err != nil {
				return nil, positioned(bs, err)
			}
			res.Objects = append(res.Objects, o)
			continue
		}
		btp, err := backendTrafficPolicy(bs, gw)
		if err != nil {
			return nil, positioned(bs, err)
		}
		if err := claimDomain(bs, domains, i, btp.Namespace+"/"+btp.Name); err != nil {
			return nil, err
		}
		o, err := newObject(egv1a1.KindBackendTrafficPolicy, btp.Namespace, btp.Name, btp)
		if err != nil {
			return nil, err
		}
		res.Objects = append(res.Objects, o)
		if !bs.Spec.HeaderHygiene.UserOwned && len(bs.Spec.Identities) > 0 {
			ctp := clientTrafficPolicy(bs, gw)
			o, err = newObject(egv1a1.KindClientTrafficPolicy, ctp.Namespace, ctp.Name, ctp)
			if err != nil {
				return nil, err
			}
			res.Objects = append(res.Objects, o)
		}
		if gw.GatewayConfig != nil && !seenConfig[gw.Namespace+"/"+gw.GatewayConfig.Name] {
			seenConfig[gw.Namespace+"/"+gw.GatewayConfig.Name] = true
			gc := gatewayConfig(bs, gw, costs)
			o, err = newObject(aigateway.KindGatewayConfig, gc.Metadata.Namespace, gc.Metadata.Name, gc)
			if err != nil {
				return nil, err
			}
			res.Objects = append(res.Objects, o)
		}
	}
	if o, ok, err := referenceGrant(bs); err != nil {
		return nil, err
	} else if ok {
		res.Objects = append(res.Objects, o)
	}
	if o, ok, err := rateLimitTLSObject(bs); err != nil {
		return nil, err
	} else if ok {
		res.Objects = append(res.Objects, o)
	}
	res.AgentgatewayConfigs = AgentgatewayConfigs(bs)
	return res, nil
}

// claimDomain records that spec.gateways[i]'s policy is <namespace>/<name>,
// which is also its rate limit domain, and refuses a second Gateway whose
// policy has the same one: a base policy file shared by two Gateways (a base
// without targetRefs takes each Gateway's), or one named like another
// Gateway's <set>-<gateway> policy. Both policies would be one object in the
// cluster and one file in -o (the first Gateway's budgets silently gone), and
// their rules would count in each other's counters.
func claimDomain(bs *spec.BudgetSet, domains map[string]int, i int, domain string) error {
	first, dup := domains[domain]
	if !dup {
		domains[domain] = i
		return nil
	}
	field := fmt.Sprintf("spec.gateways[%d]", i)
	switch {
	case bs.Spec.Gateways[i].BasePolicy != "":
		field += ".basePolicy"
	case bs.Spec.Gateways[first].BasePolicy != "":
		field = fmt.Sprintf("spec.gateways[%d].basePolicy", first)
	}
	return bs.Errorf(field, "the policy of Gateway %s is %s, as is the policy of Gateway %s (spec.gateways[%d]): one object and one rate limit domain cannot hold both Gateways' budgets; give each Gateway its own base policy with its own metadata.name",
		bs.Spec.Gateways[i].ID(), domain, bs.Spec.Gateways[first].ID(), first)
}

// gatewayConfig is the Envoy AI Gateway GatewayConfig that makes the AI
// Gateway filter write the spec's token key on every route of the Gateways
// referencing it (a route's own llmRequestCosts entry for the key wins).
// Without it, or the key in each AIGatewayRoute, the budgets count 0 tokens.
//
// costs are the CEL entries the spec's large caps and money limits charge
// (LLMRequestCosts, sorted by key): they go into the same list, so one
// GatewayConfig makes every rule of the policy count.
func gatewayConfig(bs *spec.BudgetSet, gw spec.GatewayRef, costs []CostEntry) *aigateway.GatewayConfigObject {
	list := []aigateway.LLMRequestCost{{MetadataKey: bs.Spec.TokenSource.Key, Type: gw.GatewayConfig.Type}}
	for _, c := range costs {
		if c.MetadataKey == bs.Spec.TokenSource.Key {
			continue // the spec's own key is written by its token type above
		}
		list = append(list, aigateway.LLMRequestCost{MetadataKey: c.MetadataKey, Type: c.Type, CEL: c.CEL})
	}
	return &aigateway.GatewayConfigObject{
		APIVersion: aigateway.Group + "/" + aigateway.Version,
		Kind:       aigateway.KindGatewayConfig,
		Metadata: aigateway.ObjectMeta{
			Name:      gw.GatewayConfig.Name,
			Namespace: gw.Namespace,
			Labels:    map[string]string{LabelManagedBy: ManagedByValue, LabelBudgetSet: bs.Metadata.Name},
		},
		Spec: aigateway.GatewayConfigSpec{GlobalLLMRequestCosts: list},
	}
}

// PolicyName is the name of the BackendTrafficPolicy rendered for gw. It is
// part of every shared counter's rate limit domain (<namespace>/<policy>), so
// it must stay stable across renders.
func PolicyName(bs *spec.BudgetSet, gw spec.GatewayRef) string {
	return bs.Metadata.Name + "-" + gw.Name
}

// HeaderPolicyName is the name of the ClientTrafficPolicy rendered for gw.
func HeaderPolicyName(bs *spec.BudgetSet, gw spec.GatewayRef) string {
	return PolicyName(bs, gw) + "-headers"
}

// RuleCount is how many rate limit rules the BudgetSet needs per Gateway.
func RuleCount(bs *spec.BudgetSet) int {
	n := 0
	for _, ls := range allLimits(bs) {
		n += len(ls) // one rule per window
	}
	for i := range bs.Spec.Budgets {
		if b := &bs.Spec.Budgets[i]; b.Kind() == spec.KindPerPrincipal {
			n += len(b.AllLimits()) // and per window the unidentified requests' rule
		}
	}
	if f := bs.Spec.Frontier; f != nil {
		if f.KillSwitch {
			n++
		}
	}
	return n
}

func checkLimits(bs *spec.BudgetSet) error {
	for i := range bs.Spec.Budgets {
		b := &bs.Spec.Budgets[i]
		path := fmt.Sprintf("spec.budgets[%d] (%s)", i, b.Name)
		if n := len(b.Overrides); n > MaxOverridesPerBudget {
			return &LimitError{
				Limit:  fmt.Sprintf("%d header matches per selector x %d selectors per rule to exclude overridden principals from the default rule", MaxHeadersPerSelector, MaxSelectorsPerRule),
				Object: path + " overrides", Need: n + 1, Max: MaxSelectorsPerRule * MaxHeadersPerSelector, Field: fmt.Sprintf("spec.budgets[%d].overrides", i),
				Hint: "keep overrides for the few principals that need them; give a class of principals its own identity header value and a group budget, or raise the default cap",
			}
		}
		for j, o := range b.Overrides {
			if len(o.Principal) > MaxHeaderValueLength {
				return &LimitError{
					Limit: "header match values of at most 1024 characters", Object: path + " override " + truncate(o.Principal, 40),
					Need: len(o.Principal), Max: MaxHeaderValueLength, Field: fmt.Sprintf("spec.budgets[%d].overrides[%d]", i, j),
					Hint: "principal values are header values; use a shorter identifier (a client id, not a token)",
				}
			}
		}
	}
	if f := bs.Spec.Frontier; f != nil {
		if re := ModelRegex(f.Models); len(re) > MaxHeaderValueLength {
			return &LimitError{
				Limit: "header match values of at most 1024 characters", Object: "spec.frontier.models (joined regex)",
				Need: len(re), Max: MaxHeaderValueLength, Field: "spec.frontier.models",
				Hint: "shorten the model patterns, e.g. one prefix pattern per vendor (\"gpt-5.*\")",
			}
		}
	}
	if n := len(bs.Spec.Identities); n > MaxEarlyHeadersRemoved && !bs.Spec.HeaderHygiene.UserOwned {
		return &LimitError{
			Limit: "header names removed per ClientTrafficPolicy", Object: "spec.identities", Need: n, Max: MaxEarlyHeadersRemoved, Field: "spec.identities",
			Hint: "declare fewer identity headers, or set spec.headerHygiene.userOwned and strip them in your own policy",
		}
	}
	for i, gw := range bs.Spec.Gateways {
		if gw.IsAgentgateway() {
			continue
		}
		if n := RuleCountFor(bs, gw); n > MaxRulesPerPolicy {
			return &LimitError{
				Limit:  "rate limit rules per BackendTrafficPolicy, and a Gateway takes one Gateway-level policy",
				Object: "BackendTrafficPolicy " + gw.Namespace + "/" + PolicyName(bs, gw), Need: n, Max: MaxRulesPerPolicy, Field: fmt.Sprintf("spec.gateways[%d]", i),
				Hint: "every override is one rule, and every per-principal budget one more per window for requests without an identity header: drop overrides that are close to the default cap, move a class of principals to a group budget, or split budgets across BudgetSets targeting different Gateways or listeners (sectionName)",
			}
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func meta(bs *spec.BudgetSet, gw spec.GatewayRef, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:      name,
		Namespace: gw.Namespace,
		Labels: map[string]string{
			LabelManagedBy: ManagedByValue,
			LabelBudgetSet: bs.Metadata.Name,
		},
	}
}

func targetRefs(gw spec.GatewayRef) egv1a1.PolicyTargetReferences {
	ref := gwapiv1.LocalPolicyTargetReferenceWithSectionName{
		LocalPolicyTargetReference: gwapiv1.LocalPolicyTargetReference{
			Group: gwapiv1.GroupName,
			Kind:  "Gateway",
			Name:  gwapiv1.ObjectName(gw.Name),
		},
	}
	if gw.SectionName != "" {
		sn := gwapiv1.SectionName(gw.SectionName)
		ref.SectionName = &sn
	}
	return egv1a1.PolicyTargetReferences{TargetRefs: []gwapiv1.LocalPolicyTargetReferenceWithSectionName{ref}}
}

func backendTrafficPolicy(bs *spec.BudgetSet, gw spec.GatewayRef) (*egv1a1.BackendTrafficPolicy, error) {
	name := PolicyName(bs, gw)
	if len(name) > 253 {
		return nil, &LimitError{
			Limit: "Kubernetes object names of at most 253 characters", Object: "BackendTrafficPolicy " + gw.Namespace + "/" + truncate(name, 60),
			Need: len(name), Max: 253, Hint: "shorten metadata.name or the Gateway name", Field: gatewayPath(bs, gw),
		}
	}
	var base *egv1a1.BackendTrafficPolicy
	offset := 0
	if gw.BasePolicy != "" && gw.Base == nil {
		// Rendering without the base would emit a second Gateway-level policy,
		// which EG marks Conflicted: fail instead.
		return nil, fmt.Errorf("gateway %s/%s: base policy %s was not read (load the spec with spec.LoadFile, or call ReadBasePolicies)", gw.Namespace, gw.Name, gw.BasePolicy)
	}
	if gw.Base != nil {
		var err error
		if base, err = basePolicy(gw); err != nil {
			return nil, err
		}
		if rl := base.Spec.RateLimit; rl != nil && rl.Global != nil {
			offset = len(rl.Global.Rules)
		}
		if n := offset + RuleCountFor(bs, gw); n > MaxRulesPerPolicy {
			return nil, &LimitError{
				Limit:  "rate limit rules per BackendTrafficPolicy (base policy rules included)",
				Object: "BackendTrafficPolicy " + gw.Namespace + "/" + base.Name, Need: n, Max: MaxRulesPerPolicy, Field: gatewayPath(bs, gw) + ".basePolicy",
				Hint: fmt.Sprintf("the base policy %s has %d global rules; drop overrides or base rules", gw.Base.Path, offset),
			}
		}
	}
	rules, index, err := rules(bs, gw)
	if err != nil {
		return nil, err
	}
	// EG numbers the rules of a policy by their position among all its
	// global rules: the budgets come after the base's own.
	for i := range index {
		index[i].Rule += offset
	}
	ann, err := json.Marshal(index)
	if err != nil {
		return nil, fmt.Errorf("encode %s annotation: %w", AnnotationRuleBudgets, err)
	}
	m := meta(bs, gw, name)
	m.Annotations = map[string]string{AnnotationRuleBudgets: string(ann)}
	costs, err := LLMRequestCosts(bs)
	if err != nil {
		return nil, err
	}
	if len(costs) > 0 {
		// The rules charge keys only Envoy AI Gateway writes: say which, so
		// they can be listed in its llmRequestCosts (and assert can check).
		var ca bytes.Buffer
		enc := json.NewEncoder(&ca)
		enc.SetEscapeHTML(false) // CEL's '>' stays readable
		if err := enc.Encode(costs); err != nil {
			return nil, fmt.Errorf("encode %s annotation: %w", AnnotationLLMRequestCosts, err)
		}
		m.Annotations[AnnotationLLMRequestCosts] = strings.TrimSuffix(ca.String(), "\n")
	}
	btp := &egv1a1.BackendTrafficPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: egv1a1.GroupVersion.String(), Kind: egv1a1.KindBackendTrafficPolicy},
		ObjectMeta: m,
		Spec: egv1a1.BackendTrafficPolicySpec{
			PolicyTargetReferences: targetRefs(gw),
			RateLimit: &egv1a1.RateLimitSpec{
				// Type is deprecated: Global alone selects the global rate limit.
				Global: &egv1a1.GlobalRateLimit{Rules: rules},
			},
		},
	}
	if base != nil {
		return mergeBase(base, btp, gw), nil
	}
	return btp, nil
}

func clientTrafficPolicy(bs *spec.BudgetSet, gw spec.GatewayRef) *egv1a1.ClientTrafficPolicy {
	return &egv1a1.ClientTrafficPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: egv1a1.GroupVersion.String(), Kind: egv1a1.KindClientTrafficPolicy},
		ObjectMeta: meta(bs, gw, HeaderPolicyName(bs, gw)),
		Spec: egv1a1.ClientTrafficPolicySpec{
			PolicyTargetReferences: targetRefs(gw),
			Headers: &egv1a1.HeaderSettings{
				// Before any filter runs, so only the gateway's own auth
				// filters (from a verified credential) can set these headers.
				EarlyRequestHeaders: &egv1a1.HTTPHeaderFilter{Remove: bs.IdentityHeaders()},
			},
		},
	}
}

// ModelRegex joins the frontier model patterns into one RE2 alternation, each
// pattern grouped so its own '|' cannot leak. One regex means one rule and so
// one shared bucket over all frontier models: per-model rules would each get
// the full cap.
func ModelRegex(models []string) string {
	parts := make([]string, len(models))
	for i, m := range models {
		parts[i] = "(?:" + m + ")"
	}
	return strings.Join(parts, "|")
}

func ptr[T any](v T) *T { return &v }

// tokenRule is a rule charging the response's metadata (token count, token
// units or cost) against the limit, checking only (cost 0) on the request path.
func tokenRule(c charge, r *spec.Rollout, selectors []egv1a1.RateLimitSelectCondition) egv1a1.RateLimitRule {
	md := c.metadata
	return egv1a1.RateLimitRule{
		ClientSelectors: selectors,
		Limit:           egv1a1.RateLimitValue{Requests: c.requests, Unit: c.unit},
		Cost: &egv1a1.RateLimitCost{
			Request: &egv1a1.RateLimitCostSpecifier{From: egv1a1.RateLimitCostFromNumber, Number: ptr(uint64(0))},
			Response: &egv1a1.RateLimitCostSpecifier{
				From:     egv1a1.RateLimitCostFromMetadata,
				Metadata: &md,
			},
		},
		// One bucket across every route of the Gateway.
		Shared:     ptr(true),
		ShadowMode: ptr(!r.Enforced()),
	}
}

func header(name string, t egv1a1.HeaderMatchType, value string, invert bool) egv1a1.HeaderMatch {
	h := egv1a1.HeaderMatch{Type: ptr(t), Name: name}
	if t != egv1a1.HeaderMatchDistinct {
		h.Value = ptr(value)
	}
	if invert {
		h.Invert = ptr(true)
	}
	return h
}

// distinctSelectors keys one bucket per value of hdr, excluding each of the
// overridden principals with an inverted Exact match on the same header. EG
// rejects invert on a Distinct match itself, so the exclusions are separate
// entries (the translator, internal/gatewayapi/backendtrafficpolicy.go,
// handles each header match on its own; EG's own testdata
// backendtrafficpolicy-with-shared-ratelimit.in.yaml pairs a Distinct x-org-id
// with an inverted Exact x-org-id the same way). A request whose value is
// excluded makes the header_value_match action produce nothing, so the whole
// descriptor is skipped and only the override's own rule counts it. All
// selectors of a rule are ANDed into one descriptor, so exclusions spill over
// into further selectors past 128 entries.
func distinctSelectors(hdr string, excluded []spec.Override) []egv1a1.RateLimitSelectCondition {
	matches := make([]egv1a1.HeaderMatch, 0, len(excluded)+1)
	matches = append(matches, header(hdr, egv1a1.HeaderMatchDistinct, "", false))
	for _, o := range excluded {
		matches = append(matches, header(hdr, egv1a1.HeaderMatchExact, o.Principal, true))
	}
	var sel []egv1a1.RateLimitSelectCondition
	for len(matches) > 0 {
		n := min(len(matches), MaxHeadersPerSelector)
		sel = append(sel, egv1a1.RateLimitSelectCondition{Headers: matches[:n:n]})
		matches = matches[n:]
	}
	return sel
}

// withCharge fills the annotation fields that follow one limit's charge:
// its window, measure and, for money, the currency.
func withCharge(bs *spec.BudgetSet, rb RuleBudget, l spec.Limit, c charge) RuleBudget {
	rb.Window, rb.Measure, rb.Currency = windowName(l), c.measure, ""
	if c.measure == MeasureCost {
		rb.Currency = bs.Spec.Pricing.Currency
	}
	return rb
}

func rules(bs *spec.BudgetSet, gw spec.GatewayRef) ([]egv1a1.RateLimitRule, []RuleBudget, error) {
	l := &ruleList{bs: bs}
	hdrs := principalHeaders(bs, gw)
	for i := range bs.Spec.Budgets {
		b := &bs.Spec.Budgets[i]
		if !bs.HasBudget(b, gw) {
			continue
		}
		path := fmt.Sprintf("spec.budgets[%d]", i)
		var err error
		switch b.Kind() {
		case spec.KindGroup:
			sel := func() []egv1a1.RateLimitSelectCondition {
				return []egv1a1.RateLimitSelectCondition{{Headers: []egv1a1.HeaderMatch{
					header(b.Group.Header, egv1a1.HeaderMatchExact, b.Group.Equals, false),
				}}}
			}
			err = l.addLimits(path, b.AllLimits(), &b.Rollout, sel, RuleBudget{Budget: b.Name, Kind: budgetmap.KindTokens})
		default:
			err = l.addPrincipal(path, b, hdrs)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if err := l.addFrontier(bs.Spec.Frontier); err != nil {
		return nil, nil, err
	}
	return l.rules, l.index, nil
}

// ruleList collects a policy's rules and, in the same order, the
// rule-budgets annotation's entries.
type ruleList struct {
	bs    *spec.BudgetSet
	rules []egv1a1.RateLimitRule
	index []RuleBudget
}

func (l *ruleList) add(r egv1a1.RateLimitRule, rb RuleBudget) {
	rb.Rule = len(l.rules)
	l.rules = append(l.rules, r)
	l.index = append(l.index, rb)
}

// addLimits adds one rule per window of ls: every window binds.
func (l *ruleList) addLimits(path string, ls []spec.Limit, r *spec.Rollout, sel func() []egv1a1.RateLimitSelectCondition, rb RuleBudget) error {
	for k, lim := range ls {
		c, err := limitCharge(l.bs, fmt.Sprintf("%s.limits[%d]", path, k), lim)
		if err != nil {
			return err
		}
		l.add(tokenRule(c, r, sel()), withCharge(l.bs, rb, lim, c))
	}
	return nil
}

// addPrincipal adds a per-principal budget's rules: its Distinct rule per
// window (overridden principals excluded), each override's own rules, then
// per window the rule charging the Gateway's unidentified requests (those
// carrying none of hdrs, the identity headers of the Gateway's per-principal
// budgets) to the budget's one bucket for them, principal
// agentgateway.NoClaim, capped like one principal. Without it a request
// without the header builds no descriptor for the budget and spends
// unbudgeted (Envoy Gateway's Distinct match is a request_headers action
// without skip_if_absent).
func (l *ruleList) addPrincipal(path string, b *spec.Budget, hdrs []string) error {
	overrides := b.SortedOverrides()
	sel := func() []egv1a1.RateLimitSelectCondition { return distinctSelectors(b.PerPrincipal, overrides) }
	rb := RuleBudget{Budget: b.Name, Kind: budgetmap.KindTokens}
	if err := l.addLimits(path, b.AllLimits(), &b.Rollout, sel, rb); err != nil {
		return err
	}
	for _, o := range overrides {
		sel := func() []egv1a1.RateLimitSelectCondition {
			return []egv1a1.RateLimitSelectCondition{{Headers: []egv1a1.HeaderMatch{
				header(b.PerPrincipal, egv1a1.HeaderMatchExact, o.Principal, false),
			}}}
		}
		orb := RuleBudget{Budget: b.Name, Kind: budgetmap.KindTokens, Principal: o.Principal}
		if err := l.addLimits(overridePath(path, b, o.Principal), o.AllLimits(), &b.Rollout, sel, orb); err != nil {
			return err
		}
	}
	rb.Principal = agentgateway.NoClaim
	return l.addLimits(path, b.AllLimits(), &b.Rollout, func() []egv1a1.RateLimitSelectCondition { return unidentifiedSelectors(hdrs) }, rb)
}

// addFrontier adds the frontier cap's rules and its kill switch.
func (l *ruleList) addFrontier(f *spec.Frontier) error {
	if f == nil {
		return nil
	}
	models := func() []egv1a1.RateLimitSelectCondition {
		return []egv1a1.RateLimitSelectCondition{{Headers: []egv1a1.HeaderMatch{
			header(f.Header, egv1a1.HeaderMatchRegularExpression, ModelRegex(f.Models), false),
		}}}
	}
	if err := l.addLimits("spec.frontier", f.AllLimits(), &f.Rollout, models, RuleBudget{Budget: spec.FrontierName, Kind: budgetmap.KindTokens}); err != nil {
		return err
	}
	if f.KillSwitch {
		// A token-cost rule still admits the in-flight request; a request
		// count rule with zero requests denies every one, whatever the mode.
		l.add(egv1a1.RateLimitRule{
			ClientSelectors: models(),
			Limit:           egv1a1.RateLimitValue{Requests: 0, Unit: egv1a1.RateLimitUnitDay},
			Shared:          ptr(true),
			ShadowMode:      ptr(false),
		}, RuleBudget{Budget: spec.FrontierName, Kind: budgetmap.KindKillSwitch})
	}
	return nil
}
