package render

import (
	"fmt"
	"strconv"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// Descriptor entry names of agentgateway budgets. The first entry is a CEL
// string literal naming the budget, so the server config can hold one subtree
// per budget; the second carries the principal (or the group value) from the
// verified JWT.
const (
	AgwEntryBudget    = "budget"
	AgwEntryPrincipal = "principal"
	AgwEntryGroup     = "group"
)

// Kinds of rendered objects whose Go model is budgetgen's own (their
// projects publish no Go API module): Object.Kind, with Object.Object an
// *unstructured.Unstructured.
const (
	// KindAgentgatewayPolicy is agentgateway's AgentgatewayPolicy (agentgateway.dev/v1alpha1).
	KindAgentgatewayPolicy = "AgentgatewayPolicy"
	// KindGatewayConfig is Envoy AI Gateway's GatewayConfig (aigateway.envoyproxy.io/v1beta1).
	KindGatewayConfig = "GatewayConfig"
)

// AgentgatewayDomain is the rate limit domain of an agentgateway Gateway's
// policy: <namespace>/<policy>, the same shape as Envoy Gateway's.
func AgentgatewayDomain(bs *spec.BudgetSet, gw spec.GatewayRef) string {
	return gw.Namespace + "/" + PolicyName(bs, gw)
}

// celString quotes s as a CEL string literal (Go's escapes are a subset of CEL's).
func celString(s string) string { return strconv.Quote(s) }

// ClaimExpression is the CEL expression reading a verified JWT claim:
// agentgateway's jwt variable holds the claims of the token its
// jwtAuthentication verified. It cannot fail: a request without the claim,
// or without a verified JWT (jwtAuthentication mode Optional or Permissive),
// gets the value "budgetgen/no-claim" (internal/agentgateway.NoClaim)
// through agentgateway's coalesce (crates/celx/src/general.rs), so it is
// charged to that one shared, capped bucket. A failing entry would drop its descriptor, and with every
// descriptor dropped agentgateway makes no rate limit call at all
// (crates/agentgateway/src/http/remoteratelimit.rs, build_request).
func ClaimExpression(claim string) string {
	return "coalesce(string(jwt[" + celString(claim) + "]), " + celString(agentgateway.NoClaim) + ")"
}

// agentgatewayBudgets lists the budgets placed on gw, in spec order.
func agentgatewayBudgets(bs *spec.BudgetSet, gw spec.GatewayRef) []*spec.Budget {
	var out []*spec.Budget
	for i := range bs.Spec.Budgets {
		if b := &bs.Spec.Budgets[i]; bs.HasBudget(b, gw) {
			out = append(out, b)
		}
	}
	return out
}

func agentgatewayPolicy(bs *spec.BudgetSet, gw spec.GatewayRef) (*agentgateway.Policy, error) {
	plans, err := agentgatewayPlans(bs, gw)
	if err != nil {
		return nil, err
	}
	name := PolicyName(bs, gw)
	n := 0
	for _, p := range plans {
		n += len(p.windows)
	}
	if n > agentgateway.MaxDescriptors {
		return nil, &LimitError{
			Limit: "descriptors per global rate limit of an AgentgatewayPolicy", Object: "AgentgatewayPolicy " + gw.Namespace + "/" + name,
			Need: n, Max: agentgateway.MaxDescriptors, Field: gatewayPath(bs, gw),
			Hint: "place some budgets on other Gateways (spec.budgets[].gateways); each window of a budget is one descriptor, overrides cost none on agentgateway",
		}
	}
	if len(plans) == 0 {
		return nil, fmt.Errorf("agentgateway Gateway %s: no budget is placed on it (spec.budgets[].gateways); remove it from spec.gateways", gw.ID())
	}
	descs := make([]agentgateway.Descriptor, 0, n)
	for _, p := range plans {
		b := p.budget
		claim := bs.Spec.Identities[b.Header()].JWTClaim
		second := AgwEntryPrincipal
		if b.Kind() == spec.KindGroup {
			second = AgwEntryGroup
		}
		for _, w := range p.windows {
			entries := []agentgateway.Entry{{Name: AgwEntryBudget, Expression: celString(b.Name)}}
			if p.multi() {
				entries = append(entries, agentgateway.Entry{Name: AgwEntryWindow, Expression: celString(string(w))})
			}
			descs = append(descs, agentgateway.Descriptor{
				// Tokens charging the total token count after the response,
				// named as a cost so that the request-time call only checks
				// and a response without usage amends nothing
				// (agentgateway.CostTotalTokens; docs/agentgateway.md). Each
				// window's descriptor carries the same count, so every
				// window is charged.
				Unit:    agentgateway.UnitTokens,
				Cost:    agentgateway.CostTotalTokens,
				Entries: append(entries, agentgateway.Entry{Name: second, Expression: ClaimExpression(claim)}),
			})
		}
	}
	rs := bs.Spec.RateLimitService
	core := ""
	m := meta(bs, gw, name)
	ref := agentgateway.TargetRef{Group: "gateway.networking.k8s.io", Kind: "Gateway", Name: gw.Name, SectionName: gw.SectionName}
	p := &agentgateway.Policy{
		APIVersion: agentgateway.APIVersion,
		Kind:       agentgateway.KindPolicy,
		Metadata:   m,
		Spec: agentgateway.PolicySpec{
			TargetRefs: []agentgateway.TargetRef{ref},
			Traffic: &agentgateway.Traffic{RateLimit: &agentgateway.RateLimit{Global: &agentgateway.GlobalRateLimit{
				BackendRef: &agentgateway.BackendRef{Group: &core, Kind: "Service", Name: rs.Name, Namespace: rs.Namespace, Port: ptr(rs.Port)},
				// The CRD defaults to FailClosed (a 500 when the service is
				// down); budgets fail open like Envoy Gateway's filter.
				FailureMode: agentgateway.FailOpen,
				Domain:      AgentgatewayDomain(bs, gw),
				Descriptors: descs,
			}}},
		},
	}
	if errs := agentgateway.Validate(p); len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
		}
		return nil, fmt.Errorf("AgentgatewayPolicy %s/%s breaks its schema: %s", gw.Namespace, name, strings.Join(msgs, "; "))
	}
	return p, nil
}

func agentgatewayObject(bs *spec.BudgetSet, gw spec.GatewayRef) (Object, error) {
	p, err := agentgatewayPolicy(bs, gw)
	if err != nil {
		return Object{}, err
	}
	// Keep metav1's zero creationTimestamp out of the manifest, as for EG objects.
	p.Metadata.CreationTimestamp = metav1.Time{}
	return newObject(agentgateway.KindPolicy, gw.Namespace, p.Metadata.Name, p)
}

// AgentgatewayConfigs returns the rate limit service config of every
// agentgateway Gateway's domain, in spec order: agentgateway sends only
// descriptors, so the caps, the windows and shadow_mode live here, in the
// reference service's format.
//
//	domain: <ns>/<policy>
//	descriptors:
//	- key: budget, value: <budget>           one window
//	  descriptors:
//	  - key: principal                       a bucket per principal
//	    rate_limit {unit: DAY, requests_per_unit: cap}, shadow_mode
//	  - key: principal, value: <override>    its own cap (key_value wins over key)
//	- key: budget, value: <group budget>
//	  descriptors:
//	  - key: group, value: <equals>          one shared bucket
//	- key: budget, value: <budget>           several windows
//	  descriptors:
//	  - key: window, value: day
//	    descriptors: [principal ..., principal=<override> ...]
//	  - key: window, value: month
//	    descriptors: [...]                   an override without a monthly cap: unlimited
//
// Render plans every budget (agentgatewayPlans) before anything is written,
// so the plans here cannot fail.
func AgentgatewayConfigs(bs *spec.BudgetSet) []*rlsconfv3.RateLimitConfig {
	var out []*rlsconfv3.RateLimitConfig
	for _, gw := range bs.Spec.Gateways {
		if !gw.IsAgentgateway() {
			continue
		}
		plans, err := agentgatewayPlans(bs, gw)
		if err != nil {
			continue
		}
		domain := AgentgatewayDomain(bs, gw)
		cfg := &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain}
		for _, p := range plans {
			shadow := !p.budget.Enforced()
			top := &rlsconfv3.RateLimitDescriptor{Key: AgwEntryBudget, Value: p.budget.Name}
			parent := map[spec.Period]*rlsconfv3.RateLimitDescriptor{}
			for _, w := range p.windows {
				parent[w] = top
				if p.multi() {
					wd := &rlsconfv3.RateLimitDescriptor{Key: AgwEntryWindow, Value: string(w)}
					top.Descriptors = append(top.Descriptors, wd)
					parent[w] = wd
				}
			}
			for _, l := range p.leaves() {
				d := &rlsconfv3.RateLimitDescriptor{Key: l.key, Value: l.value, ShadowMode: shadow}
				if l.unlimited {
					d.RateLimit = &rlsconfv3.RateLimitPolicy{Unlimited: true}
				} else {
					d.RateLimit = &rlsconfv3.RateLimitPolicy{Unit: agwUnits[l.window], RequestsPerUnit: uint32(l.tokens)}
				}
				parent[l.window].Descriptors = append(parent[l.window].Descriptors, d)
			}
			cfg.Descriptors = append(cfg.Descriptors, top)
		}
		out = append(out, cfg)
	}
	return out
}

// checkAgentgatewayCaps refuses, before anything is rendered, a budget on an
// agentgateway Gateway whose caps agentgatewayCaps cannot express.
func checkAgentgatewayCaps(bs *spec.BudgetSet) error {
	for _, gw := range bs.Spec.Gateways {
		if !gw.IsAgentgateway() {
			continue
		}
		if _, err := agentgatewayPlans(bs, gw); err != nil {
			return err
		}
	}
	return nil
}
