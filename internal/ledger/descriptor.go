package ledger

import (
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	rlkey "github.com/budgetgen/budgetgen/internal/ratelimit/key"
)

// FromDescriptor names the ledger rule and principal of a descriptor the
// rate limit config matched. free has bit i set when entry i was matched by a
// bare key or a wildcard, so its value came from the request (entries past 64
// count as free). configRule is the config path of the matched limit.
//
// The rule is the first entry's value when the config named it (Envoy
// Gateway's generic_key <ns>/<policy>/rule/<i>), else configRule; the
// principal is EncodePrincipal of the free values, in order.
func FromDescriptor(domain, configRule string, entries []*rlcommon.RateLimitDescriptor_Entry, free uint64) (RuleID, string) {
	r := RuleID{Domain: domain, Rule: configRule}
	if len(entries) > 0 && free&1 == 0 {
		r.Rule = entries[0].GetValue()
	}
	// The common case, one request-supplied value, allocates nothing.
	n, last := 0, ""
	for i, e := range entries {
		if i >= 64 || free&(1<<uint(i)) != 0 {
			n++
			last = e.GetValue()
		}
	}
	if n == 1 {
		return r, EncodePrincipal1(bounded(last))
	}
	parts := make([]string, 0, n)
	for i, e := range entries {
		if i >= 64 || free&(1<<uint(i)) != 0 {
			parts = append(parts, bounded(e.GetValue()))
		}
	}
	return r, EncodePrincipal(parts)
}

// bounded is a principal value as the ledger names it: a value too long for
// a counter key is named by its digest, as the counter is, marked apart from
// every value a request can send (DigestPart).
func bounded(v string) string {
	if len(v) > rlkey.MaxValueBytes {
		return DigestPart(v)
	}
	return v
}
