package rlsconfig

import (
	xdscorev3 "github.com/cncf/xds/go/xds/core/v3"
	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// RouteRateLimits returns the rate_limits Envoy Gateway attaches to every route
// a policy targets, grouped by domain (the rate limit filter that evaluates
// them). It follows EG's buildRouteRateLimits for shared rules:
//
//   - per rule, one rate_limit per method match (one when there is none), whose
//     actions are: generic_key <ns>/<policy>/rule/<i>, then one action per
//     selector item in the order of Configs (Distinct header -> request_headers,
//     Exact/RegularExpression header -> header_value_match with expect_match =
//     !invert, method/path -> header_value_match on :method/:path, sourceCIDR ->
//     remote_address_match, query parameters), or generic_key rule-<d>-match--1;
//   - hits_addend from the request cost (number or %DYNAMIC_METADATA(ns:key)%);
//   - with a response cost, a second rate_limit with the same actions,
//     apply_on_stream_done: true and the response cost's hits_addend.
func RouteRateLimits(p *egv1a1.BackendTrafficPolicy) (map[string][]*routev3.RateLimit, error) {
	rules, err := policyRules(p)
	if err != nil {
		return nil, err
	}
	out := map[string][]*routev3.RateLimit{}
	for _, r := range rules {
		methods := r.methods
		if len(methods) == 0 {
			methods = []stringMatch{{}} // no method match: one rate_limit
		}
		for mi := range methods {
			var method *stringMatch
			if len(r.methods) > 0 {
				method = &methods[mi]
			}
			actions := []*routev3.RateLimit_Action{genericKey(r.name, r.name)}
			for m := range r.headers {
				actions = append(actions, headerAction(r.domainIdx, m, &r.headers[m]))
			}
			if method != nil {
				actions = append(actions, valueMatch(methodKey(r.domainIdx), ":method", method))
			}
			if r.path != nil {
				actions = append(actions, valueMatch(pathKey(r.domainIdx), ":path", r.path))
			}
			if c := r.cidr; c != nil {
				actions = append(actions, remoteAddressMatch(keyMaskedRemoteAddress, cidrValue(c), c))
				if c.distinct {
					actions = append(actions, remoteAddressMatch(keyRemoteAddress, remoteAddressFormat, c))
				}
			}
			for m := range r.queryParams {
				actions = append(actions, queryAction(r.domainIdx, len(r.headers)+m, &r.queryParams[m]))
			}
			if !r.matchSet() {
				actions = append(actions, genericKey(matchKey(r.domainIdx, -1), matchKey(r.domainIdx, -1)))
			}
			rl := &routev3.RateLimit{Actions: actions, XRatelimitOption: xRateLimitOption(r.xRateLimit)}
			if md := r.fromMetadata; md != nil {
				rl.Limit = &routev3.RateLimit_Override{OverrideSpecifier: &routev3.RateLimit_Override_DynamicMetadata_{
					DynamicMetadata: &routev3.RateLimit_Override_DynamicMetadata{MetadataKey: &metadatav3.MetadataKey{
						Key:  md.Namespace,
						Path: []*metadatav3.MetadataKey_PathSegment{{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: md.Key}}},
					}},
				}}
			}
			if r.requestCost != nil {
				rl.HitsAddend = hitsAddend(r.requestCost)
			}
			out[r.domain] = append(out[r.domain], rl)
			if r.responseCost != nil {
				out[r.domain] = append(out[r.domain], &routev3.RateLimit{
					Actions:           actions,
					ApplyOnStreamDone: true,
					XRatelimitOption:  rl.XRatelimitOption,
					HitsAddend:        hitsAddend(r.responseCost),
					Limit:             rl.Limit,
				})
			}
		}
	}
	return out, nil
}

func genericKey(k, v string) *routev3.RateLimit_Action {
	return &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_GenericKey_{
		GenericKey: &routev3.RateLimit_Action_GenericKey{DescriptorKey: k, DescriptorValue: v},
	}}
}

func headerAction(ruleIdx, m int, h *stringMatch) *routev3.RateLimit_Action {
	key := matchKey(ruleIdx, m)
	if h.distinct {
		return &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_RequestHeaders_{
			RequestHeaders: &routev3.RateLimit_Action_RequestHeaders{HeaderName: h.name, DescriptorKey: key},
		}}
	}
	return valueMatch(key, h.name, h)
}

func valueMatch(key, header string, m *stringMatch) *routev3.RateLimit_Action {
	return &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_HeaderValueMatch_{
		HeaderValueMatch: &routev3.RateLimit_Action_HeaderValueMatch{
			DescriptorKey:   key,
			DescriptorValue: key,
			ExpectMatch:     wrapperspb.Bool(!m.invert),
			Headers: []*routev3.HeaderMatcher{{
				Name:                 header,
				HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: xdsStringMatcher(m)},
			}},
		},
	}}
}

func queryAction(ruleIdx, m int, q *stringMatch) *routev3.RateLimit_Action {
	key := matchKey(ruleIdx, m)
	if q.distinct {
		return &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_QueryParameters_{
			QueryParameters: &routev3.RateLimit_Action_QueryParameters{QueryParameterName: q.name, DescriptorKey: key},
		}}
	}
	return &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_QueryParameterValueMatch_{
		QueryParameterValueMatch: &routev3.RateLimit_Action_QueryParameterValueMatch{
			DescriptorKey:   key,
			DescriptorValue: key,
			ExpectMatch:     wrapperspb.Bool(!q.invert),
			QueryParameters: []*routev3.QueryParameterMatcher{{
				Name:                         q.name,
				QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_StringMatch{StringMatch: xdsStringMatcher(q)},
			}},
		},
	}}
}

func remoteAddressMatch(key, value string, c *cidrMatch) *routev3.RateLimit_Action {
	return &routev3.RateLimit_Action{ActionSpecifier: &routev3.RateLimit_Action_RemoteAddressMatch_{
		RemoteAddressMatch: &routev3.RateLimit_Action_RemoteAddressMatch{
			DescriptorKey:   key,
			DescriptorValue: value,
			AddressMatcher: &matcherv3.AddressMatcher{
				Ranges:      []*xdscorev3.CidrRange{{AddressPrefix: c.prefix, PrefixLen: wrapperspb.UInt32(c.maskLen)}},
				InvertMatch: c.invert,
			},
		},
	}}
}

// xdsStringMatcher follows EG's buildXdsStringMatcher.
func xdsStringMatcher(m *stringMatch) *matcherv3.StringMatcher {
	switch {
	case m.exact != nil:
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: *m.exact}}
	case m.prefix != nil:
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: *m.prefix}}
	case m.regex != nil:
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: *m.regex}}}
	}
	return &matcherv3.StringMatcher{}
}

func hitsAddend(c *cost) *routev3.RateLimit_HitsAddend {
	h := &routev3.RateLimit_HitsAddend{}
	if c.number != nil {
		h.Number = wrapperspb.UInt64(*c.number)
	}
	if c.format != nil {
		h.Format = *c.format
	}
	return h
}

func xRateLimitOption(o *egv1a1.XRateLimitHeadersOption) routev3.RateLimit_XRateLimitOption {
	if o == nil {
		return routev3.RateLimit_UNSPECIFIED
	}
	switch *o {
	case egv1a1.XRateLimitHeadersOptionDisabled:
		return routev3.RateLimit_OFF
	case egv1a1.XRateLimitHeadersOptionDraftVersion03:
		return routev3.RateLimit_DRAFT_VERSION_03
	}
	return routev3.RateLimit_UNSPECIFIED
}
