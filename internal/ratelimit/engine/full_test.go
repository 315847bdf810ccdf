package engine

import (
	"context"
	"testing"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/observe"
	"github.com/budgetgen/budgetgen/internal/store/memory"
)

// TestFullStoreDenies: a memory store at its bound refuses a new principal;
// by default (memory.FullDeny) the request is denied whatever the failure
// policy, so a bounded store still enforces. With memory.FullFailurePolicy
// the failure policy answers (allow: OK, uncounted). An existing principal
// is counted and answered as usual either way.
func TestFullStoreDenies(t *testing.T) {
	for _, tc := range []struct {
		full   memory.FullPolicy
		policy decide.FailurePolicy
		want   rlpb.RateLimitResponse_Code
	}{
		{memory.FullDeny, decide.FailAllow, rlpb.RateLimitResponse_OVER_LIMIT},
		{memory.FullDeny, decide.FailDeny, rlpb.RateLimitResponse_OVER_LIMIT},
		{memory.FullDeny, decide.FailError, rlpb.RateLimitResponse_OVER_LIMIT},
		{memory.FullFailurePolicy, decide.FailAllow, rlpb.RateLimitResponse_OK},
		{memory.FullFailurePolicy, decide.FailDeny, rlpb.RateLimitResponse_OVER_LIMIT},
	} {
		t.Run(tc.full.String()+"/"+tc.policy.String(), func(t *testing.T) {
			mem := memory.New(memory.Options{MaxCounters: 1, FullPolicy: tc.full})
			defer mem.Close()
			e, err := New(Options{Store: mem, FailurePolicy: tc.policy, OverLimitCacheSize: -1, Observers: []observe.Observer{observe.NewMetrics(metrics.New(nil))}})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			e.SetConfig(mustConfig(t, testConfig))
			resp, err := e.ShouldRateLimit(context.Background(), req("d", 0, d("user", "old")))
			if err != nil || resp.OverallCode != rlpb.RateLimitResponse_OK {
				t.Fatalf("first principal: %v, %v", resp, err)
			}
			resp, err = e.ShouldRateLimit(context.Background(), req("d", 0, d("user", "new")))
			if err != nil {
				t.Fatalf("new principal at the bound: err %v, want an answer", err)
			}
			if resp.OverallCode != tc.want {
				t.Fatalf("new principal at the bound: %v, want %v", resp.OverallCode, tc.want)
			}
			resp, err = e.ShouldRateLimit(context.Background(), req("d", 0, d("user", "old")))
			if err != nil || resp.OverallCode != rlpb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 1 {
				t.Fatalf("existing principal at the bound: %v, %v (want OK, 1 remaining of 3)", resp, err)
			}
			if st := mem.Stats(); st.Refused != 1 || st.Counters != 1 {
				t.Fatalf("store stats %+v: want 1 refusal, 1 counter", st)
			}
		})
	}
}
