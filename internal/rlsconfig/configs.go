package rlsconfig

import (
	"fmt"
	"sort"
	"strings"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
)

// Configs returns the rate limit service configs Envoy Gateway serves for the
// shared global rules of policies: one per domain <ns>/<policy>, sorted by
// domain (EG builds them from a map; the order carries no meaning there, and
// sorting makes the output deterministic).
//
// Shape of one domain (EG BuildRateLimitServiceConfig + addRateLimitDescriptor +
// buildRateLimitServiceDescriptors):
//
//	domain: <ns>/<policy>          (name is the domain too)
//	descriptors:
//	- key = value = <ns>/<policy>/rule/<i>         one per rule, no shadow_mode
//	  descriptors:
//	  - key rule-<d>-match-<m> [value = key]       one nested level per selector item
//	    shadow_mode: <rule.shadowMode>             on every nested level
//	    ...
//	      rate_limit {unit, requests_per_unit}     on the last level
//
// <i> is the rule's index in the policy, <d> its index among the policy's shared
// rules (equal when all rules are shared). The nesting order is: headers (Distinct
// -> key only, any value; Exact/RegularExpression -> key = value, inverted or not),
// methods (one rule-<d>-method level however many methods), path (rule-<d>-path),
// sourceCIDR (masked_remote_address = <cidr> or invert:<cidr>, then remote_address
// when Distinct), query parameters (match indices continue after the headers'),
// and rule-<d>-match--1 when the rule has no selector. Costs add no config: the
// request-time and the stream-done rate_limits of a rule share its descriptors.
//
// EG builds these from the routes a policy attaches to; a policy whose targets
// have no routes (or that is not Accepted) yields nothing in EG. Configs assumes
// each policy applies to at least one route.
func Configs(policies []*egv1a1.BackendTrafficPolicy) ([]*rlsconfv3.RateLimitConfig, error) {
	byDomain := map[string]*rlsconfv3.RateLimitConfig{}
	seen := map[string]bool{}
	for _, p := range policies {
		if p == nil {
			continue
		}
		id := p.Namespace + "/" + p.Name
		if seen[id] {
			return nil, fmt.Errorf("BackendTrafficPolicy %s: listed twice", id)
		}
		seen[id] = true
		rules, err := policyRules(p)
		if err != nil {
			return nil, err
		}
		for _, r := range rules {
			cfg := byDomain[r.domain]
			if cfg == nil {
				cfg = &rlsconfv3.RateLimitConfig{Name: r.domain, Domain: r.domain}
				byDomain[r.domain] = cfg
			}
			cfg.Descriptors = append(cfg.Descriptors, &rlsconfv3.RateLimitDescriptor{
				Key:         r.name,
				Value:       r.name,
				Descriptors: []*rlsconfv3.RateLimitDescriptor{serviceDescriptor(r)},
			})
		}
	}
	out := make([]*rlsconfv3.RateLimitConfig, 0, len(byDomain))
	for _, c := range byDomain {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Domain < out[j].Domain })
	return out, nil
}

// serviceDescriptor builds the nested chain for one rule, following EG's
// buildRateLimitServiceDescriptors step by step.
func serviceDescriptor(r *rule) *rlsconfv3.RateLimitDescriptor {
	var head, cur *rlsconfv3.RateLimitDescriptor
	push := func(d *rlsconfv3.RateLimitDescriptor) {
		d.ShadowMode = r.shadow
		if cur == nil {
			head = d
		} else {
			cur.Descriptors = []*rlsconfv3.RateLimitDescriptor{d}
		}
		cur = d
	}
	for m, h := range r.headers {
		d := &rlsconfv3.RateLimitDescriptor{Key: matchKey(r.domainIdx, m)}
		if !h.distinct {
			d.Value = d.Key
		}
		push(d)
	}
	if len(r.methods) > 0 {
		push(&rlsconfv3.RateLimitDescriptor{Key: methodKey(r.domainIdx), Value: methodKey(r.domainIdx)})
	}
	if r.path != nil {
		push(&rlsconfv3.RateLimitDescriptor{Key: pathKey(r.domainIdx), Value: pathKey(r.domainIdx)})
	}
	if r.cidr != nil {
		push(&rlsconfv3.RateLimitDescriptor{Key: keyMaskedRemoteAddress, Value: cidrValue(r.cidr)})
		if r.cidr.distinct {
			push(&rlsconfv3.RateLimitDescriptor{Key: keyRemoteAddress})
		}
	}
	for m, q := range r.queryParams {
		d := &rlsconfv3.RateLimitDescriptor{Key: matchKey(r.domainIdx, len(r.headers)+m)}
		if !q.distinct {
			d.Value = d.Key
		}
		push(d)
	}
	if !r.matchSet() {
		head, cur = nil, nil
		push(&rlsconfv3.RateLimitDescriptor{Key: matchKey(r.domainIdx, -1), Value: matchKey(r.domainIdx, -1)})
	}
	unit, _ := unitValue(r.unit)
	cur.RateLimit = &rlsconfv3.RateLimitPolicy{RequestsPerUnit: r.requests, Unit: unit}
	return head
}

// unitValue maps an EG unit to the proto enum the way EG does
// (RateLimitUnit_value[strings.ToUpper(unit)]); unknown units are reported.
func unitValue(u egv1a1.RateLimitUnit) (rlsconfv3.RateLimitUnit, bool) {
	v, ok := rlsconfv3.RateLimitUnit_value[strings.ToUpper(string(u))]
	if !ok || v == int32(rlsconfv3.RateLimitUnit_UNKNOWN) {
		return rlsconfv3.RateLimitUnit_UNKNOWN, false
	}
	return rlsconfv3.RateLimitUnit(v), true
}
