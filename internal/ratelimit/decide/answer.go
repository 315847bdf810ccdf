package decide

import (
	"errors"
	"fmt"
	"math"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// FailurePolicy is what a request gets when the store fails or misses its
// deadline.
type FailurePolicy uint8

const (
	// FailAllow answers OK (Envoy Gateway's default is fail-open too).
	FailAllow FailurePolicy = iota
	// FailDeny answers OVER_LIMIT for every descriptor that has a limit.
	FailDeny
	// FailError returns a *StoreError (gRPC Unavailable); Envoy then
	// applies its own failure_mode_deny.
	FailError
)

// FailurePolicyNames are the names of the failure policies (FAILURE_POLICY,
// --failure-policy).
var FailurePolicyNames = []string{"allow", "deny", "error"}

func (p FailurePolicy) String() string {
	if int(p) < len(FailurePolicyNames) {
		return FailurePolicyNames[p]
	}
	return fmt.Sprintf("FailurePolicy(%d)", p)
}

// ParseFailurePolicy parses allow, deny or error; "" is allow.
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	switch s {
	case "", "allow":
		return FailAllow, nil
	case "deny":
		return FailDeny, nil
	case "error":
		return FailError, nil
	}
	return FailAllow, fmt.Errorf("unknown failure policy %q (want allow, deny or error)", s)
}

// DefaultNearLimitRatio is the reference's NEAR_LIMIT_RATIO.
const DefaultNearLimitRatio = 0.8

// Policy is how Answer turns totals into a response.
type Policy struct {
	// Failure applies when the store call failed.
	Failure FailurePolicy
	// ShadowMode is the global SHADOW_MODE: an OVER_LIMIT overall code
	// becomes OK (descriptor statuses keep OVER_LIMIT).
	ShadowMode bool
	// NearLimitRatio marks an OK item Near above this share of its limit;
	// 0 means DefaultNearLimitRatio.
	NearLimitRatio float32
}

// Verdict is the request-level outcome of Answer, for observers.
type Verdict struct {
	// Over: the overall code is OVER_LIMIT.
	Over bool
	// GlobalShadowed: OVER_LIMIT turned OK by the global shadow mode.
	GlobalShadowed bool
}

func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// oneResponse, twoResponse and smallResponse hold a response of one, two or
// up to smallN descriptors and its parts, so the common answers (a budget; a budget and
// a frontier cap, or a few windows) cost one allocation.
type oneResponse struct {
	resp rlpb.RateLimitResponse
	st   [1]rlpb.RateLimitResponse_DescriptorStatus
	p    [1]*rlpb.RateLimitResponse_DescriptorStatus
	d    [1]durationpb.Duration
}

type twoResponse struct {
	resp rlpb.RateLimitResponse
	st   [2]rlpb.RateLimitResponse_DescriptorStatus
	p    [2]*rlpb.RateLimitResponse_DescriptorStatus
	d    [2]durationpb.Duration
}

type smallResponse struct {
	resp rlpb.RateLimitResponse
	st   [smallN]rlpb.RateLimitResponse_DescriptorStatus
	p    [smallN]*rlpb.RateLimitResponse_DescriptorStatus
	d    [smallN]durationpb.Duration
}

const smallN = 4

// Replier receives one request's decision (an asynchronous engine's
// answer), exactly once: the response, or the error ShouldRateLimit would
// return. It must not block: it runs on the goroutine that ended the
// request's store call.
type Replier interface {
	Reply(resp *rlpb.RateLimitResponse, err error)
}

// Answer builds the response from the charged items (their Total, and for a
// reserving budget Reserved and Held, set by the charger), storeErr the
// store call's error (nil if it succeeded or no call was needed), now the
// request's instant in Unix seconds. It sets each item's Over, Near and
// ReserveDenied. Under FailError a store error is returned as *StoreError
// and no response. A store error wrapping ErrDenied denies every limited
// item whatever the policy.
//
// An item of a reserving budget answers what is left once the holds of
// unfinished requests are set aside: limit - total - reserved. A reserving
// check (Reserve > 0) is admitted iff total + reserved < limit (the store
// then holds its Reserve); it is ReserveDenied when the counter alone would
// have admitted it (total <= limit), so false denials can be counted.
func Answer(items []Item, storeErr error, now int64, p Policy) (*rlpb.RateLimitResponse, Verdict, error) {
	denied := storeErr != nil && errors.Is(storeErr, ErrDenied)
	if storeErr != nil && p.Failure == FailError && !denied {
		return nil, Verdict{}, &StoreError{Err: storeErr}
	}
	nearF := p.NearLimitRatio
	if nearF == 0 {
		nearF = DefaultNearLimitRatio
	}
	n := len(items)
	var (
		resp     *rlpb.RateLimitResponse
		statuses []rlpb.RateLimitResponse_DescriptorStatus
		ptrs     []*rlpb.RateLimitResponse_DescriptorStatus
		durs     []durationpb.Duration
	)
	switch {
	case n == 1:
		one := new(oneResponse)
		resp, statuses, ptrs, durs = &one.resp, one.st[:], one.p[:], one.d[:]
	case n == 2:
		two := new(twoResponse)
		resp, statuses, ptrs, durs = &two.resp, two.st[:], two.p[:], two.d[:]
	case n <= smallN:
		sm := new(smallResponse)
		resp, statuses, ptrs, durs = &sm.resp, sm.st[:n], sm.p[:n], sm.d[:n]
	default:
		resp = &rlpb.RateLimitResponse{}
		statuses = make([]rlpb.RateLimitResponse_DescriptorStatus, n)
		ptrs = make([]*rlpb.RateLimitResponse_DescriptorStatus, n)
	}
	resp.OverallCode = rlpb.RateLimitResponse_OK
	for i := range items {
		it := &items[i]
		st := &statuses[i]
		ptrs[i] = st
		st.Code = rlpb.RateLimitResponse_OK
		it.Over, it.Near, it.ReserveDenied = false, false, false
		if it.Unlimited {
			st.LimitRemaining = math.MaxUint32
			continue
		}
		l := it.Limit
		if l == nil {
			continue
		}
		if durs == nil {
			durs = make([]durationpb.Duration, n)
		}
		durs[i].Seconds = it.WindowEnd - now
		st.DurationUntilReset = &durs[i]
		st.CurrentLimit = l.Proto
		st.LimitRemaining = judge(it, storeErr, denied, p.Failure, nearF)
		if it.Over && !l.ShadowMode {
			st.Code = rlpb.RateLimitResponse_OVER_LIMIT
			if l.QuotaMode {
				// The reference's quota mode: report the violation but answer OK
				// (without duration_until_reset, as it rebuilds the status).
				st.Code = rlpb.RateLimitResponse_OK
				st.DurationUntilReset = nil
			} else {
				resp.OverallCode = rlpb.RateLimitResponse_OVER_LIMIT
			}
		}
	}
	resp.Statuses = ptrs
	var v Verdict
	if resp.OverallCode == rlpb.RateLimitResponse_OVER_LIMIT {
		if p.ShadowMode {
			resp.OverallCode = rlpb.RateLimitResponse_OK
			v.GlobalShadowed = true
		} else {
			v.Over = true
		}
	}
	return resp, v, nil
}

// judge sets a limited item's Over, Near and ReserveDenied from its totals
// (or from the store's failure: denied when the store asked to deny) and
// returns what is left of its limit (0 when over).
func judge(it *Item, storeErr error, denied bool, failure FailurePolicy, nearF float32) (remaining uint32) {
	l := it.Limit
	limit := uint64(l.RequestsPerUnit)
	switch {
	case it.Cached:
		it.Total = 0
		it.Over = true
	case storeErr != nil:
		it.Total, it.Reserved, it.Held = 0, 0, false
		it.Over = failure == FailDeny || denied
		if !it.Over {
			return l.RequestsPerUnit
		}
	default:
		used := satAdd(it.Total, it.Reserved)
		if it.Reserve > 0 {
			it.Over = !it.Held && used >= limit
			it.ReserveDenied = it.Over && it.Total <= limit
		} else {
			it.Over = it.Total > limit
		}
		if !it.Over {
			it.Near = used > uint64(math.Floor(float64(float32(limit)*nearF)))
			return uint32(limit - min(limit, used))
		}
	}
	return 0
}
