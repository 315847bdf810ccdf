package key

import (
	"strconv"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// budgetTag starts every budget key after the prefix. It differs from
// safeTag, so a budget counter never shares a key with a per-rule counter.
const budgetTag = "bgb1|"

// AppendBudget appends the key of a budget's counter: (bucket, principal,
// window), whatever domain or descriptor the request came with, so one
// principal's traffic through several Gateways (Envoy Gateway or
// agentgateway) fills one counter. The principal is fixed when the rule
// counts one named principal (an override), else the values of the entries
// whose bit is set in free (matched by a bare key: request-supplied). Every
// part is length-prefixed, so distinct triples never collide; budget keys
// use this encoding in both formats (the reference has no such counter).
func (e Encoder) AppendBudget(dst []byte, bucket, fixed string, isFixed bool, entries []*rlcommon.RateLimitDescriptor_Entry, free uint64, divider, windowStart int64) []byte {
	dst = append(dst, e.Prefix...)
	dst = append(dst, budgetTag...)
	dst = appendNetstring(dst, bucket)
	if isFixed {
		dst = append(dst, "1:"...)
		dst = appendValue(dst, fixed)
	} else {
		n := 0
		for i := range entries {
			if isFree(free, i) {
				n++
			}
		}
		dst = strconv.AppendInt(dst, int64(n), 10)
		dst = append(dst, ':')
		for i, en := range entries {
			if isFree(free, i) {
				dst = appendValue(dst, en.GetValue())
			}
		}
	}
	dst = append(dst, '@')
	dst = strconv.AppendInt(dst, divider, 10)
	dst = append(dst, '|')
	return strconv.AppendInt(dst, windowStart, 10)
}

// isFree treats entries past 64 as request-supplied, like the ledger.
func isFree(free uint64, i int) bool { return i >= 64 || free&(1<<uint(i)) != 0 }
