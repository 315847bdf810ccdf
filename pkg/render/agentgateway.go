package render

import (
	"fmt"
	"math"
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

// KindAgentgatewayPolicy is the Object.Kind of a rendered AgentgatewayPolicy.
const KindAgentgatewayPolicy = agentgateway.KindPolicy

// AgentgatewayDomain is the rate limit domain of an agentgateway Gateway's
// policy: <namespace>/<policy>, the same shape as Envoy Gateway's.
func AgentgatewayDomain(bs *spec.BudgetSet, gw spec.GatewayRef) string {
	return gw.Namespace + "/" + PolicyName(bs, gw)
}

// celString quotes s as a CEL string literal (Go's escapes are a subset of CEL's).
func celString(s string) string { return strconv.Quote(s) }

// ClaimExpression is the CEL expression reading a verified JWT claim:
// agentgateway's jwt variable holds the claims of the token its
// jwtAuthentication verified (null without one, so the descriptor is dropped).
func ClaimExpression(claim string) string { return "string(jwt[" + celString(claim) + "])" }

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
	budgets := agentgatewayBudgets(bs, gw)
	name := PolicyName(bs, gw)
	if n := len(budgets); n > agentgateway.MaxDescriptors {
		return nil, &LimitError{
			Limit: "descriptors per global rate limit of an AgentgatewayPolicy", Object: "AgentgatewayPolicy " + gw.Namespace + "/" + name,
			Need: n, Max: agentgateway.MaxDescriptors,
			Hint: "place some budgets on other Gateways (spec.budgets[].gateways); overrides cost no descriptor on agentgateway",
		}
	}
	if len(budgets) == 0 {
		return nil, fmt.Errorf("agentgateway Gateway %s: no budget is placed on it (spec.budgets[].gateways); remove it from spec.gateways", gw.ID())
	}
	descs := make([]agentgateway.Descriptor, 0, len(budgets))
	for _, b := range budgets {
		claim := bs.Spec.Identities[b.Header()].JWTClaim
		second := AgwEntryPrincipal
		if b.Kind() == spec.KindGroup {
			second = AgwEntryGroup
		}
		descs = append(descs, agentgateway.Descriptor{
			// Tokens with no cost: the total token count, charged after the
			// response; the request-time call only checks (docs/agentgateway.md).
			Unit: agentgateway.UnitTokens,
			Entries: []agentgateway.Entry{
				{Name: AgwEntryBudget, Expression: celString(b.Name)},
				{Name: second, Expression: ClaimExpression(claim)},
			},
		})
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
// descriptors, so the caps, the day window and shadow_mode live here, in the
// reference service's format.
//
//	domain: <ns>/<policy>
//	descriptors:
//	- key: budget, value: <budget>
//	  descriptors:
//	  - key: principal                       a bucket per principal
//	    rate_limit {unit: DAY, requests_per_unit: cap}, shadow_mode
//	  - key: principal, value: <override>    its own cap (key_value wins over key)
//	- key: budget, value: <group budget>
//	  descriptors:
//	  - key: group, value: <equals>          one shared bucket
//
// Render checks every cap with checkAgentgatewayCaps first; dailyCap only
// reads the one it accepted.
func AgentgatewayConfigs(bs *spec.BudgetSet) []*rlsconfv3.RateLimitConfig {
	dailyCap := func(tokensPerDay int64, limits []spec.Limit) int64 {
		c, _ := agentgatewayDailyCap("", tokensPerDay, limits)
		return c
	}
	var out []*rlsconfv3.RateLimitConfig
	for _, gw := range bs.Spec.Gateways {
		if !gw.IsAgentgateway() {
			continue
		}
		domain := AgentgatewayDomain(bs, gw)
		cfg := &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain}
		for _, b := range agentgatewayBudgets(bs, gw) {
			shadow := !b.Enforced()
			leaf := func(key, value string, limit int64) *rlsconfv3.RateLimitDescriptor {
				return &rlsconfv3.RateLimitDescriptor{
					Key: key, Value: value, ShadowMode: shadow,
					RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: uint32(limit)},
				}
			}
			top := &rlsconfv3.RateLimitDescriptor{Key: AgwEntryBudget, Value: b.Name}
			if b.Kind() == spec.KindGroup {
				top.Descriptors = append(top.Descriptors, leaf(AgwEntryGroup, b.Group.Equals, dailyCap(b.TokensPerDay, b.Limits)))
			} else {
				top.Descriptors = append(top.Descriptors, leaf(AgwEntryPrincipal, "", dailyCap(b.TokensPerDay, b.Limits)))
				for _, o := range b.SortedOverrides() {
					top.Descriptors = append(top.Descriptors, leaf(AgwEntryPrincipal, o.Principal, dailyCap(o.TokensPerDay, o.Limits)))
				}
			}
			cfg.Descriptors = append(cfg.Descriptors, top)
		}
		out = append(out, cfg)
	}
	return out
}

// agentgatewayDailyCap is the one cap an agentgateway budget renders to: its
// rate limit config has a single DAY limit per descriptor, in tokens, within
// uint32. Anything else (several windows, hours/weeks/months, money, caps
// past uint32) is refused rather than rendered as a wrong cap: a missing cap
// would read as 0, which denies every request once the budget is enforced.
func agentgatewayDailyCap(path string, tokensPerDay int64, limits []spec.Limit) (int64, error) {
	capTokens := tokensPerDay
	switch {
	case len(limits) > 1:
		return 0, &UnsupportedError{Object: path, Reason: "a budget on an agentgateway Gateway takes one daily token cap (several windows are not rendered for agentgateway yet)"}
	case len(limits) == 1:
		l := limits[0]
		if l.Cost != "" || (l.Per != "" && l.Per != spec.PeriodDay) {
			return 0, &UnsupportedError{Object: path, Reason: "a budget on an agentgateway Gateway takes a daily token cap only (per: day, tokens)"}
		}
		capTokens = l.Tokens
	}
	if capTokens < 1 || capTokens > math.MaxUint32 {
		return 0, &UnsupportedError{Object: path, Reason: fmt.Sprintf("daily token cap %d is not within 1..4294967295 for agentgateway", capTokens)}
	}
	return capTokens, nil
}

// checkAgentgatewayCaps refuses, before anything is rendered, a budget on an
// agentgateway Gateway whose caps agentgatewayDailyCap cannot express.
func checkAgentgatewayCaps(bs *spec.BudgetSet) error {
	for _, gw := range bs.Spec.Gateways {
		if !gw.IsAgentgateway() {
			continue
		}
		for _, b := range agentgatewayBudgets(bs, gw) {
			if _, err := agentgatewayDailyCap("spec.budgets["+b.Name+"]", b.TokensPerDay, b.Limits); err != nil {
				return err
			}
			for _, o := range b.SortedOverrides() {
				if _, err := agentgatewayDailyCap("spec.budgets["+b.Name+"].overrides["+o.Principal+"]", o.TokensPerDay, o.Limits); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
