// Package refseq is the differential test's request sequence, its config
// and the answers envoyproxy/ratelimit gives to it: test/reftest checks every
// answer against the real reference on each run, internal/ratelimit/decide
// checks the pure decision core against the same table. One table, so the
// two cannot drift apart. Test support only: nothing in the service imports it.
package refseq

import (
	"fmt"
	"math"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Config is the sequence's rate limit config (domain diff, file diff.yaml):
// every matching and limit feature the sequence uses.
const Config = `domain: diff
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: tier
    value: gold
    rate_limit: {unlimited: true, replaces: [{name: per_user}]}
  - key: who
    rate_limit: {unit: hour, requests_per_unit: 2, name: per_user}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: kill
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: quota
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: generic_key
    value: default/policy/rule/0
    descriptors:
      - key: rule-0-match-0
        rate_limit: {unit: day, requests_per_unit: 4}
  - key: week
    rate_limit: {unit: week, requests_per_unit: 2}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 2}
  - key: year
    rate_limit: {unit: year, requests_per_unit: 2}
  - key: files
    value: f*
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: nested
    value: n*
    descriptors:
      - key: leaf
        rate_limit: {unit: minute, requests_per_unit: 1}
`

// Step is one call of the sequence and the reference's answer to it, in
// Describe's form.
type Step struct {
	Name    string
	Request *rlpb.RateLimitRequest
	Want    string
}

// Dsc builds a descriptor from key, value pairs.
func Dsc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// Hits sets a descriptor's hits_addend.
func Hits(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// Rq builds a request.
func Rq(domain string, h uint32, ds ...*rlcommon.RateLimitDescriptor) *rlpb.RateLimitRequest {
	return &rlpb.RateLimitRequest{Domain: domain, HitsAddend: h, Descriptors: ds}
}

// Steps returns the sequence, fresh requests every call (callers may send
// them concurrently to several services). It runs inside one minute window
// of epoch windows (the reference's): week, month and year keys differ from
// the calendar default on purpose.
func Steps() []Step {
	var steps []Step
	// add appends one step per wanted answer: the same request sent again.
	add := func(name string, r *rlpb.RateLimitRequest, want ...string) {
		for i, w := range want {
			steps = append(steps, Step{fmt.Sprintf("%s %d", name, i), r, w})
		}
	}
	over := Dsc("any", "thing")
	over.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
	add("plain hit crossing 5/day", Rq("diff", 0, Dsc("user", "alice")),
		"OK OK/4@5/DAY", "OK OK/3@5/DAY", "OK OK/2@5/DAY", "OK OK/1@5/DAY", "OK OK/0@5/DAY", "OVER_LIMIT OVER_LIMIT/0@5/DAY", "OVER_LIMIT OVER_LIMIT/0@5/DAY")
	add("request hits_addend 3", Rq("diff", 3, Dsc("user", "bob")), "OK OK/2@5/DAY", "OVER_LIMIT OVER_LIMIT/0@5/DAY")
	add("request hits_addend 0 means 1", Rq("diff", 0, Dsc("user", "carol")), "OK OK/4@5/DAY")
	add("descriptor check-only fresh", Rq("diff", 0, Hits(Dsc("tokens", "t1"), 0)), "OK OK/100@100/HOUR")
	add("descriptor 60 tokens", Rq("diff", 9, Hits(Dsc("tokens", "t1"), 60)), "OK OK/40@100/HOUR")
	add("descriptor check-only", Rq("diff", 0, Hits(Dsc("tokens", "t1"), 0)), "OK OK/40@100/HOUR")
	add("descriptor 40 tokens to exactly the limit", Rq("diff", 0, Hits(Dsc("tokens", "t1"), 40)), "OK OK/0@100/HOUR")
	add("check-only at the limit is OK", Rq("diff", 0, Hits(Dsc("tokens", "t1"), 0)), "OK OK/0@100/HOUR")
	add("one more token is over", Rq("diff", 0, Hits(Dsc("tokens", "t1"), 1)), "OVER_LIMIT OVER_LIMIT/0@100/HOUR")
	add("check-only above the limit is over", Rq("diff", 0, Hits(Dsc("tokens", "t1"), 0)), "OVER_LIMIT OVER_LIMIT/0@100/HOUR")
	add("mixed request and descriptor addends", Rq("diff", 2, Dsc("user", "dave"), Hits(Dsc("tokens", "t2"), 7), Hits(Dsc("tokens", "t3"), 0)),
		"OK OK/3@5/DAY OK/93@100/HOUR OK/100@100/HOUR")
	add("shadow", Rq("diff", 0, Dsc("shadow", "s")), "OK OK/1@2/DAY", "OK OK/0@2/DAY", "OK OK/0@2/DAY", "OK OK/0@2/DAY")
	add("unlimited", Rq("diff", 0, Dsc("free", "x")), "OK OK/max")
	add("replaced by gold", Rq("diff", 0, Dsc("who", "w"), Dsc("tier", "gold")), "OK OK/0 OK/max", "OK OK/0 OK/max", "OK OK/0 OK/max")
	add("not replaced", Rq("diff", 0, Dsc("who", "w"), Dsc("tier", "silver")),
		"OK OK/1@2/HOUR OK/0", "OK OK/0@2/HOUR OK/0", "OVER_LIMIT OVER_LIMIT/0@2/HOUR OK/0")
	add("wildcard", Rq("diff", 0, Dsc("path", "/api/v1/items")),
		"OK OK/2@3/MINUTE", "OK OK/1@3/MINUTE", "OK OK/0@3/MINUTE", "OVER_LIMIT OVER_LIMIT/0@3/MINUTE")
	add("wildcard miss", Rq("diff", 0, Dsc("path", "/web")), "OK OK/0")
	add("unknown domain", Rq("nope", 0, Dsc("user", "alice")), "OK OK/0")
	add("unmatched key", Rq("diff", 0, Dsc("other", "x")), "OK OK/0")
	add("depth mismatch", Rq("diff", 0, Dsc("user", "alice", "extra", "x")), "OK OK/0")
	add("limit 0 check-only", Rq("diff", 0, Hits(Dsc("kill", "k"), 0)), "OK OK/0@0/MINUTE")
	add("limit 0 denies", Rq("diff", 0, Dsc("kill", "k")), "OVER_LIMIT OVER_LIMIT/0@0/MINUTE")
	add("quota mode", Rq("diff", 0, Dsc("quota", "q")), "OK OK/0@1/DAY", "OK OK/0@1/DAY")
	add("nested EG shape", Rq("diff", 0, Dsc("generic_key", "default/policy/rule/0", "rule-0-match-0", "eve")),
		"OK OK/3@4/DAY", "OK OK/2@4/DAY", "OK OK/1@4/DAY", "OK OK/0@4/DAY", "OVER_LIMIT OVER_LIMIT/0@4/DAY")
	add("underscore", Rq("diff", 0, Dsc("user", "x_y")), "OK OK/4@5/DAY", "OK OK/3@5/DAY")
	for _, u := range []string{"week", "month", "year"} {
		unit := strings.ToUpper(u)
		add(u, Rq("diff", 0, Dsc(u, "p")), "OK OK/1@2/"+unit, "OK OK/0@2/"+unit, "OVER_LIMIT OVER_LIMIT/0@2/"+unit)
	}
	add("share_threshold foo", Rq("diff", 0, Dsc("files", "foo")), "OK OK/1@2/HOUR")
	add("share_threshold fab", Rq("diff", 0, Dsc("files", "fab")), "OK OK/0@2/HOUR")
	add("share_threshold fx", Rq("diff", 0, Dsc("files", "fx")), "OVER_LIMIT OVER_LIMIT/0@2/HOUR")
	add("wildcard parent n1", Rq("diff", 0, Dsc("nested", "n1", "leaf", "x")), "OK OK/0@1/MINUTE")
	add("wildcard parent n2", Rq("diff", 0, Dsc("nested", "n2", "leaf", "x")), "OK OK/0@1/MINUTE")
	add("wildcard parent n1 again", Rq("diff", 0, Dsc("nested", "n1", "leaf", "x")), "OVER_LIMIT OVER_LIMIT/0@1/MINUTE")
	add("request limit override", Rq("diff", 0, over), "OK OK/1@2/HOUR", "OK OK/0@2/HOUR", "OVER_LIMIT OVER_LIMIT/0@2/HOUR")
	add("many descriptors in one request",
		Rq("diff", 0, Dsc("user", "m1"), Dsc("user", "m2"), Dsc("shadow", "m3"), Dsc("free", "m4"), Dsc("path", "/api/z"), Dsc("nope", "z")),
		"OK OK/4@5/DAY OK/4@5/DAY OK/1@2/DAY OK/max OK/2@3/MINUTE OK/0")
	return steps
}

// Describe is an answer in the table's form: the overall code, then per
// status its code, remaining count (max for unlimited) and current limit.
func Describe(r *rlpb.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.OverallCode.String())
	for _, s := range r.Statuses {
		rem := fmt.Sprint(s.LimitRemaining)
		if s.LimitRemaining == math.MaxUint32 {
			rem = "max"
		}
		fmt.Fprintf(&b, " %s/%s", s.Code, rem)
		if s.CurrentLimit != nil {
			fmt.Fprintf(&b, "@%d/%s", s.CurrentLimit.RequestsPerUnit, s.CurrentLimit.Unit)
		}
	}
	return b.String()
}
