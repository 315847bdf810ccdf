package rlsconfig

import (
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Phase says when Envoy's rate limit filter builds descriptors.
type Phase int

const (
	// PhaseRequest is the check made on request headers: rate_limits without
	// apply_on_stream_done. A request cost of Number 0 makes it a pure check.
	PhaseRequest Phase = iota
	// PhaseStreamDone is the charge made when the stream ends: rate_limits with
	// apply_on_stream_done (EG's response cost). Its result never blocks.
	PhaseStreamDone
)

// Request is what Envoy knows about one HTTP request when it builds
// descriptors.
type Request struct {
	// Headers by name (matched case-insensitively), one value each, including
	// the pseudo-headers ":method" and ":path" (with its query string).
	Headers map[string]string
	// Metadata holds dynamic metadata as Envoy's formatter prints it, keyed
	// "namespace:key", e.g. "io.envoy.ai_gateway:llm_total_token" -> "1234".
	Metadata map[string]string
	// RemoteAddress is the downstream address without port, for sourceCIDR
	// selectors. The zero value means unknown: CIDR actions then do not match.
	RemoteAddress netip.Addr
}

// maxHitsAddend is Envoy's bound on a hits_addend (route_components.proto).
const maxHitsAddend = 1_000_000_000

// Requests returns the ShouldRateLimit calls Envoy makes for req in phase, given
// the rate_limits of the route (RouteRateLimits): one call per domain that has at
// least one descriptor, in the order of EG's filters (sorted by domain), each
// with the route's rate_limits in order. This is Envoy's rule, per rate_limit:
//
//   - generic_key always adds its entry;
//   - request_headers adds (key, header value); a missing header drops the whole
//     descriptor (EG never sets skip_if_absent);
//   - header_value_match adds (key, value) when the header matcher's result equals
//     expect_match, else drops the descriptor. A missing header never matches,
//     so an inverted (expect_match false) selector counts requests without it;
//   - query_parameters / query_parameter_value_match do the same on :path's query;
//   - remote_address_match adds its entry when the address is in (or, inverted,
//     outside) the range; %DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT% is substituted;
//   - hits_addend number -> descriptor hits_addend; a format is substituted from
//     Metadata and must print a non-negative integer <= 1e9, else Envoy ignores
//     the descriptor;
//   - the request-level hits_addend stays 0 (unset: the service uses 1).
//
// A rate_limit with a limit override (limit.fromMetadata) is not simulated and
// is reported as an error.
func Requests(routeLimits map[string][]*routev3.RateLimit, req Request, phase Phase) ([]*rlsv3.RateLimitRequest, error) {
	headers := make(map[string]string, len(req.Headers))
	for k, v := range req.Headers {
		headers[strings.ToLower(k)] = v
	}
	domains := make([]string, 0, len(routeLimits))
	for d := range routeLimits {
		domains = append(domains, d)
	}
	sort.Strings(domains)
	var out []*rlsv3.RateLimitRequest
	for _, domain := range domains {
		call := &rlsv3.RateLimitRequest{Domain: domain}
		for i, rl := range routeLimits[domain] {
			if rl.ApplyOnStreamDone != (phase == PhaseStreamDone) {
				continue
			}
			if rl.Limit != nil {
				return nil, fmt.Errorf("domain %s rate_limits[%d]: limit override from metadata is not simulated", domain, i)
			}
			d, ok, err := descriptor(rl, headers, req)
			if err != nil {
				return nil, fmt.Errorf("domain %s rate_limits[%d]: %w", domain, i, err)
			}
			if ok {
				call.Descriptors = append(call.Descriptors, d)
			}
		}
		if len(call.Descriptors) > 0 {
			out = append(out, call)
		}
	}
	return out, nil
}

// descriptor is what Envoy sends for one rate limit of a route: one entry
// per action, in order. false (no descriptor) when an action does not
// apply to the request, as Envoy skips the whole rate limit then.
func descriptor(rl *routev3.RateLimit, headers map[string]string, req Request) (*rlcommonv3.RateLimitDescriptor, bool, error) {
	d := &rlcommonv3.RateLimitDescriptor{}
	for _, a := range rl.Actions {
		e, ok, err := actionEntry(a, headers, req)
		if err != nil || !ok {
			return nil, false, err
		}
		d.Entries = append(d.Entries, e)
	}
	if h := rl.HitsAddend; h != nil {
		switch {
		case h.Number != nil:
			d.HitsAddend = wrapperspb.UInt64(h.Number.Value)
		case h.Format != "":
			n, ok := substituteHits(h.Format, req.Metadata)
			if !ok {
				return nil, false, nil
			}
			d.HitsAddend = wrapperspb.UInt64(n)
		}
	}
	return d, true, nil
}

// actionEntry is the descriptor entry of one action; false when the action does
// not apply to the request.
func actionEntry(a *routev3.RateLimit_Action, headers map[string]string, req Request) (*rlcommonv3.RateLimitDescriptor_Entry, bool, error) {
	kv := func(k, v string) (*rlcommonv3.RateLimitDescriptor_Entry, bool, error) {
		return &rlcommonv3.RateLimitDescriptor_Entry{Key: k, Value: v}, true, nil
	}
	switch s := a.ActionSpecifier.(type) {
	case *routev3.RateLimit_Action_GenericKey_:
		return kv(s.GenericKey.DescriptorKey, s.GenericKey.DescriptorValue)
	case *routev3.RateLimit_Action_RequestHeaders_:
		v, ok := headers[strings.ToLower(s.RequestHeaders.HeaderName)]
		if !ok {
			return nil, false, nil
		}
		return kv(s.RequestHeaders.DescriptorKey, v)
	case *routev3.RateLimit_Action_HeaderValueMatch_:
		hv := s.HeaderValueMatch
		matched := true
		for _, hm := range hv.Headers {
			v, present := headers[strings.ToLower(hm.Name)]
			ok, err := stringMatches(hm.GetStringMatch(), v, present)
			if err != nil {
				return nil, false, err
			}
			matched = matched && ok
		}
		if matched != expectMatch(hv.ExpectMatch) {
			return nil, false, nil
		}
		return kv(hv.DescriptorKey, hv.DescriptorValue)
	case *routev3.RateLimit_Action_QueryParameters_:
		v, ok := queryParam(headers[":path"], s.QueryParameters.QueryParameterName)
		if !ok {
			return nil, false, nil
		}
		return kv(s.QueryParameters.DescriptorKey, v)
	case *routev3.RateLimit_Action_QueryParameterValueMatch_:
		qv := s.QueryParameterValueMatch
		matched := true
		for _, qm := range qv.QueryParameters {
			v, present := queryParam(headers[":path"], qm.Name)
			ok, err := stringMatches(qm.GetStringMatch(), v, present)
			if err != nil {
				return nil, false, err
			}
			matched = matched && ok
		}
		if matched != expectMatch(qv.ExpectMatch) {
			return nil, false, nil
		}
		return kv(qv.DescriptorKey, qv.DescriptorValue)
	case *routev3.RateLimit_Action_RemoteAddressMatch_:
		return remoteAddressEntry(s.RemoteAddressMatch, req)
	}
	return nil, false, fmt.Errorf("action %T is not simulated", a.ActionSpecifier)
}

// remoteAddressEntry is a remote_address_match action's entry: the
// request's address in (or, inverted, out of) the ranges.
func remoteAddressEntry(ram *routev3.RateLimit_Action_RemoteAddressMatch, req Request) (*rlcommonv3.RateLimitDescriptor_Entry, bool, error) {
	if !req.RemoteAddress.IsValid() {
		return nil, false, nil
	}
	in := false
	for _, r := range ram.GetAddressMatcher().GetRanges() {
		p, err := netip.ParsePrefix(r.AddressPrefix + "/" + strconv.Itoa(int(r.GetPrefixLen().GetValue())))
		if err != nil {
			return nil, false, fmt.Errorf("remote_address_match range: %w", err)
		}
		in = in || p.Contains(req.RemoteAddress)
	}
	if in == ram.GetAddressMatcher().GetInvertMatch() {
		return nil, false, nil
	}
	value := strings.ReplaceAll(ram.DescriptorValue, remoteAddressFormat, req.RemoteAddress.String())
	return &rlcommonv3.RateLimitDescriptor_Entry{Key: ram.DescriptorKey, Value: value}, true, nil
}

func expectMatch(b *wrapperspb.BoolValue) bool { return b == nil || b.Value }

var dynamicMetadataFormat = regexp.MustCompile(`^%DYNAMIC_METADATA\(([^:)]+):([^)]+)\)%$`)

// substituteHits evaluates the only format EG emits for a cost from metadata.
func substituteHits(format string, md map[string]string) (uint64, bool) {
	m := dynamicMetadataFormat.FindStringSubmatch(format)
	if m == nil {
		return 0, false
	}
	v, ok := md[m[1]+":"+m[2]]
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n > maxHitsAddend {
		return 0, false
	}
	return n, true
}

// stringMatches evaluates an Envoy StringMatcher on one header value; an absent
// header never matches a string matcher.
func stringMatches(m *matcherv3.StringMatcher, v string, present bool) (bool, error) {
	if !present || m == nil {
		return false, nil
	}
	switch p := m.MatchPattern.(type) {
	case *matcherv3.StringMatcher_Exact:
		if m.IgnoreCase {
			return strings.EqualFold(v, p.Exact), nil
		}
		return v == p.Exact, nil
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(v, p.Prefix), nil
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(v, p.Suffix), nil
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(v, p.Contains), nil
	case *matcherv3.StringMatcher_SafeRegex:
		// Envoy's safe_regex is RE2 with full-match semantics.
		re, err := regexp.Compile(`^(?:` + p.SafeRegex.GetRegex() + `)$`)
		if err != nil {
			return false, fmt.Errorf("safe_regex %q: %w", p.SafeRegex.GetRegex(), err)
		}
		return re.MatchString(v), nil
	}
	return false, fmt.Errorf("string matcher %T is not simulated", m.MatchPattern)
}

func queryParam(path, name string) (string, bool) {
	i := strings.IndexByte(path, '?')
	if i < 0 {
		return "", false
	}
	q, err := url.ParseQuery(path[i+1:])
	if err != nil {
		return "", false
	}
	vs, ok := q[name]
	if !ok || len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}
