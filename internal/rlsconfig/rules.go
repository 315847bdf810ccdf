// Package rlsconfig derives, from rendered BackendTrafficPolicies, what Envoy
// Gateway v1.9.1 derives from them for shared global rate limit rules:
//
//   - the rate limit service config it serves over xDS (Configs), as the
//     go-control-plane proto and as the reference service's YAML files;
//   - the rate_limits actions it puts on every route the policy targets
//     (RouteRateLimits);
//   - the descriptors Envoy then sends for a given request (Requests).
//
// The code mirrors internal/gatewayapi/backendtrafficpolicy.go (buildRateLimitRule)
// and internal/xds/translator/ratelimit.go (buildRouteRateLimits,
// buildRateLimitServiceDescriptors, addRateLimitDescriptor) of EG v1.9.1; those
// packages are internal to EG's module, so they cannot be imported. Comments name
// the EG function each piece follows.
//
// Only shared rules (shared: true) are supported: a non-shared rule's domain and
// first descriptor are the listener and route names, which need the Gateway and
// its routes to compute. Such a rule is an error, not silently skipped.
package rlsconfig

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// ErrNotShared is wrapped by the error for a global rule without shared: true.
var ErrNotShared = errors.New("rule is not shared")

// Descriptor names EG uses (internal/xds/translator/ratelimit.go).
const (
	keyMaskedRemoteAddress = "masked_remote_address"
	keyRemoteAddress       = "remote_address"
	invertPrefix           = "invert:"
	remoteAddressFormat    = "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"
)

// stringMatch mirrors ir.StringMatch: exactly one of exact, prefix, regex is
// set unless distinct.
type stringMatch struct {
	name     string
	exact    *string
	prefix   *string
	regex    *string
	distinct bool
	invert   bool
}

type cidrMatch struct {
	cidr     string // normalised network, as net.IPNet.String()
	prefix   string
	maskLen  uint32
	distinct bool
	invert   bool
}

type cost struct {
	number *uint64
	format *string
}

// rule mirrors ir.RateLimitRule for one global rule of one policy.
type rule struct {
	name         string // <ns>/<policy>/rule/<index in the policy>
	domain       string // <ns>/<policy>
	domainIdx    int    // index among the shared rules of the policy (EG getDomainRuleIndex)
	requests     uint32
	unit         egv1a1.RateLimitUnit
	fromMetadata *egv1a1.RateLimitValueMetadata
	headers      []stringMatch
	methods      []stringMatch
	path         *stringMatch
	cidr         *cidrMatch
	queryParams  []stringMatch
	requestCost  *cost
	responseCost *cost
	shadow       bool
	xRateLimit   *egv1a1.XRateLimitHeadersOption
}

func (r *rule) matchSet() bool {
	return len(r.headers) != 0 || r.path != nil || len(r.methods) != 0 || r.cidr != nil || len(r.queryParams) != 0
}

// policyRules converts the global rules of one policy, following EG's
// buildRateLimit/buildGlobalRateLimit/buildRateLimitRule. A policy without
// global rules yields none.
func policyRules(p *egv1a1.BackendTrafficPolicy) ([]*rule, error) {
	if p == nil || p.Spec.RateLimit == nil {
		return nil, nil
	}
	rl := p.Spec.RateLimit
	where := "BackendTrafficPolicy " + p.Namespace + "/" + p.Name
	//lint:ignore SA1019 older manifests set the deprecated type and EG still honours it
	if rl.Type != nil { //nolint:staticcheck // the deprecated type is still read: older manifests set it, and EG honours it
		//lint:ignore SA1019 as above
		switch *rl.Type { //nolint:staticcheck // as above
		case egv1a1.GlobalRateLimitType:
			if rl.Global == nil {
				return nil, fmt.Errorf("%s: spec.rateLimit: type Global without global configuration", where)
			}
		case egv1a1.LocalRateLimitType:
			return nil, nil // EG ignores spec.rateLimit.global when the deprecated type says Local
		default:
			//lint:ignore SA1019 as above
			return nil, fmt.Errorf("%s: spec.rateLimit.type: invalid rateLimit type %q", where, *rl.Type) //nolint:staticcheck // as above
		}
	}
	if rl.Global == nil {
		return nil, nil
	}
	if p.Namespace == "" || p.Name == "" {
		return nil, fmt.Errorf("%s: metadata.namespace and metadata.name are required to name the domain", where)
	}
	out := make([]*rule, 0, len(rl.Global.Rules))
	shared := 0
	for i := range rl.Global.Rules {
		src := &rl.Global.Rules[i]
		field := fmt.Sprintf("spec.rateLimit.global.rules[%d]", i)
		if src.Shared == nil || !*src.Shared {
			return nil, fmt.Errorf("%s: %s: %w (only shared: true rules have a policy-wide domain)", where, field, ErrNotShared)
		}
		r, err := convertRule(src)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", where, field, err)
		}
		r.domain = p.Namespace + "/" + p.Name
		r.name = budgetmap.RuleDescriptor(r.domain, i) // EG irRuleName: index within the policy
		r.domainIdx = shared                           // EG getDomainRuleIndex: count of earlier shared rules
		shared++
		out = append(out, r)
	}
	return out, nil
}

// convertRule follows EG's buildRateLimitRule.
func convertRule(src *egv1a1.RateLimitRule) (*rule, error) {
	if _, ok := unitValue(src.Limit.Unit); !ok {
		return nil, fmt.Errorf("limit.unit: unknown unit %q", src.Limit.Unit)
	}
	r := &rule{
		requests:     src.Limit.Requests,
		unit:         src.Limit.Unit,
		fromMetadata: src.Limit.FromMetadata,
		shadow:       src.ShadowMode != nil && *src.ShadowMode,
		xRateLimit:   src.XRateLimitHeaders,
	}
	for s, sel := range src.ClientSelectors {
		sf := fmt.Sprintf("clientSelectors[%d]", s)
		if len(sel.Headers) == 0 && len(sel.Methods) == 0 && sel.Path == nil && sel.SourceCIDR == nil && len(sel.QueryParams) == 0 {
			return nil, fmt.Errorf("%s: at least one of headers, methods, path, sourceCIDR or queryParams must be specified", sf)
		}
		for h, hm := range sel.Headers {
			m, err := convertHeader(hm)
			if err != nil {
				return nil, fmt.Errorf("%s.headers[%d]: %w", sf, h, err)
			}
			r.headers = append(r.headers, m)
		}
		for _, mm := range sel.Methods {
			r.methods = append(r.methods, stringMatch{exact: ptr(string(mm.Value)), invert: deref(mm.Invert)})
		}
		if sel.Path != nil {
			m, err := convertPath(sel.Path)
			if err != nil {
				return nil, fmt.Errorf("%s.path: %w", sf, err)
			}
			r.path = &m // a later selector's path replaces an earlier one, as in EG
		}
		if sel.SourceCIDR != nil {
			c, err := convertCIDR(sel.SourceCIDR)
			if err != nil {
				return nil, fmt.Errorf("%s.sourceCIDR: %w", sf, err)
			}
			r.cidr = c
		}
		for q, qm := range sel.QueryParams {
			m, err := convertQueryParam(qm)
			if err != nil {
				return nil, fmt.Errorf("%s.queryParams[%d]: %w", sf, q, err)
			}
			r.queryParams = append(r.queryParams, m)
		}
	}
	if c := src.Cost; c != nil {
		if c.Request != nil {
			r.requestCost = convertCost(c.Request)
		}
		if c.Response != nil {
			r.responseCost = convertCost(c.Response)
		}
	}
	return r, nil
}

func convertHeader(h egv1a1.HeaderMatch) (stringMatch, error) {
	// A nil type is the CRD default, Exact. (EG dereferences the type and
	// relies on the API server having defaulted it.)
	typ := egv1a1.HeaderMatchExact
	if h.Type != nil {
		typ = *h.Type
	}
	switch {
	case typ == egv1a1.HeaderMatchExact && h.Value != nil:
		return stringMatch{name: h.Name, exact: h.Value, invert: deref(h.Invert)}, nil
	case typ == egv1a1.HeaderMatchRegularExpression && h.Value != nil:
		if _, err := regexp.Compile(*h.Value); err != nil {
			return stringMatch{}, fmt.Errorf("regex %q is invalid: %w", *h.Value, err)
		}
		return stringMatch{name: h.Name, regex: h.Value, invert: deref(h.Invert)}, nil
	case typ == egv1a1.HeaderMatchDistinct && h.Value == nil:
		if deref(h.Invert) {
			return stringMatch{}, errors.New("invert is not applicable for distinct header match type")
		}
		return stringMatch{name: h.Name, distinct: true}, nil
	default:
		return stringMatch{}, fmt.Errorf("either the header type %q is not valid or the header is missing a value (Distinct takes no value)", typ)
	}
}

func convertPath(p *egv1a1.PathMatch) (stringMatch, error) {
	typ := gwapiv1.PathMatchPathPrefix
	if p.Type != nil {
		typ = *p.Type
	}
	inv := deref(p.Invert)
	switch typ {
	case gwapiv1.PathMatchPathPrefix:
		if p.Value == "/" {
			return stringMatch{prefix: ptr(p.Value), invert: inv}, nil
		}
		// EG regex.PathSeparatedPrefixRegex: Envoy's HeaderMatcher has no
		// path-separated prefix, so EG uses a regex.
		re := "^" + regexp.QuoteMeta(strings.TrimSuffix(p.Value, "/")) + `(/.*|\?.*|#.*|;.*|$)`
		return stringMatch{regex: &re, invert: inv}, nil
	case gwapiv1.PathMatchExact:
		return stringMatch{exact: ptr(p.Value), invert: inv}, nil
	case gwapiv1.PathMatchRegularExpression:
		if _, err := regexp.Compile(p.Value); err != nil {
			return stringMatch{}, fmt.Errorf("regex %q is invalid: %w", p.Value, err)
		}
		return stringMatch{regex: ptr(p.Value), invert: inv}, nil
	default:
		return stringMatch{}, fmt.Errorf("invalid path type %q", typ)
	}
}

func convertCIDR(s *egv1a1.SourceMatch) (*cidrMatch, error) {
	_, ipn, err := net.ParseCIDR(s.Value)
	if err != nil {
		return nil, err
	}
	mask, _ := ipn.Mask.Size()
	return &cidrMatch{
		cidr:     ipn.String(),
		prefix:   ipn.IP.String(),
		maskLen:  uint32(mask),
		distinct: s.Type != nil && *s.Type == egv1a1.SourceMatchDistinct,
		invert:   deref(s.Invert),
	}, nil
}

func convertQueryParam(q egv1a1.QueryParamMatch) (stringMatch, error) {
	if q.Name == "" {
		return stringMatch{}, errors.New("name is required when QueryParamMatch is specified")
	}
	typ := egv1a1.QueryParamMatchExact
	if q.Type != nil {
		typ = *q.Type
	}
	switch typ {
	case egv1a1.QueryParamMatchExact:
		if q.Value == nil || *q.Value == "" {
			return stringMatch{}, errors.New("value is required for Exact query parameter match")
		}
		return stringMatch{name: q.Name, exact: q.Value, invert: deref(q.Invert)}, nil
	case egv1a1.QueryParamMatchRegularExpression:
		if q.Value == nil || *q.Value == "" {
			return stringMatch{}, errors.New("value is required for RegularExpression query parameter match")
		}
		if _, err := regexp.Compile(*q.Value); err != nil {
			return stringMatch{}, fmt.Errorf("regex %q is invalid: %w", *q.Value, err)
		}
		return stringMatch{name: q.Name, regex: q.Value, invert: deref(q.Invert)}, nil
	case egv1a1.QueryParamMatchDistinct:
		if deref(q.Invert) {
			return stringMatch{}, errors.New("invert is not applicable for distinct query parameter match type")
		}
		if q.Value != nil {
			return stringMatch{}, errors.New("value is not applicable for distinct query parameter match type")
		}
		return stringMatch{name: q.Name, distinct: true}, nil
	default:
		return stringMatch{}, fmt.Errorf("invalid query parameter match type %q", typ)
	}
}

// convertCost follows EG's translateRateLimitCost.
func convertCost(c *egv1a1.RateLimitCostSpecifier) *cost {
	out := &cost{number: c.Number}
	if c.Metadata != nil {
		f := fmt.Sprintf("%%DYNAMIC_METADATA(%s:%s)%%", c.Metadata.Namespace, c.Metadata.Key)
		out.format = &f
	}
	return out
}

// Descriptor key names (EG getRouteRuleDescriptor and friends).
func matchKey(ruleIdx, matchIdx int) string {
	return "rule-" + strconv.Itoa(ruleIdx) + "-match-" + strconv.Itoa(matchIdx)
}
func methodKey(ruleIdx int) string { return "rule-" + strconv.Itoa(ruleIdx) + "-method" }
func pathKey(ruleIdx int) string   { return "rule-" + strconv.Itoa(ruleIdx) + "-path" }

func cidrValue(c *cidrMatch) string {
	if c.invert {
		return invertPrefix + c.cidr
	}
	return c.cidr
}

func ptr[T any](v T) *T { return &v }

func deref(b *bool) bool { return b != nil && *b }
