package observe

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/store"
)

// TestMetricsObserver: each outcome lands in its series: tokens, ok, near
// (in addition to ok), over, shadow over; request classes; a limit of a
// config replaced meanwhile still finds its series by domain and rule.
func TestMetricsObserver(t *testing.T) {
	c, err := config.Load([]config.File{{Name: "t.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: u\n    rate_limit: {unit: day, requests_per_unit: 5}\n  - key: s\n    shadow_mode: true\n    rate_limit: {unit: day, requests_per_unit: 1}\n")}})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(prometheus.NewRegistry())
	o := NewMetrics(m)
	o.SetConfig(c)
	u, s := c.Limits()[0], c.Limits()[1]
	ctx := context.Background()
	for _, it := range []decide.Item{
		{Limit: u, Hits: 2},
		{Limit: u, Hits: 1, Near: true},
		{Limit: u, Hits: 0, Over: true},
		{Limit: s, Hits: 1, Over: true},
	} {
		o.Descriptor(ctx, &Descriptor{Item: &it})
	}
	for _, r := range []Request{{Class: RequestOK}, {Class: RequestOverLimit, FailurePolicy: "deny"}, {Class: RequestInvalid}, {Class: RequestOK, GlobalShadowed: true}} {
		o.Request(ctx, &r)
	}
	keys := map[string]metrics.RuleKey{
		"u": {Domain: "d", Rule: "u", BudgetKey: metrics.BudgetKey{Window: "day", Mode: "enforce"}},
		"s": {Domain: "d", Rule: "s", BudgetKey: metrics.BudgetKey{Window: "day", Mode: "shadow"}},
	}
	got := func(rule, outcome string) float64 {
		return testutil.ToFloat64(m.Decision(keys[rule], outcome))
	}
	if fmt.Sprint(got("u", "ok"), got("u", "near_limit"), got("u", "over_limit"), got("s", "shadow_over_limit"), got("s", "over_limit")) != "2 1 1 1 0" {
		t.Fatalf("decisions: ok %v near %v over %v shadow %v shadow-as-over %v", got("u", "ok"), got("u", "near_limit"), got("u", "over_limit"), got("s", "shadow_over_limit"), got("s", "over_limit"))
	}
	if v := testutil.ToFloat64(m.ForRule(keys["u"]).Tokens); v != 3 {
		t.Fatalf("tokens = %v, want 3", v)
	}
	if fmt.Sprint(testutil.ToFloat64(m.RequestsOK), testutil.ToFloat64(m.RequestsOverLimit), testutil.ToFloat64(m.Requests.WithLabelValues("invalid_argument")),
		testutil.ToFloat64(m.FailurePolicy.WithLabelValues("deny")), testutil.ToFloat64(m.GlobalShadow)) != "2 1 1 1 1" {
		t.Fatal("request metrics wrong")
	}
	// A config loaded meanwhile: the old limit still counts under its rule.
	c2, _ := config.Load([]config.File{{Name: "t.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: u\n    rate_limit: {unit: day, requests_per_unit: 9}\n")}})
	o.SetConfig(c2)
	o.Descriptor(ctx, &Descriptor{Item: &decide.Item{Limit: u, Hits: 1}})
	if got("u", "ok") != 3 {
		t.Fatalf("ok after a reload = %v, want 3", got("u", "ok"))
	}
	// charge.Events
	o.Unsent("deferred", 4)
	o.Flushed(6, time.Millisecond, nil)
	o.Charged(time.Millisecond, fmt.Errorf("%w: %w", store.ErrUnavailable, context.DeadlineExceeded))
	if testutil.ToFloat64(m.UnsentHits.WithLabelValues("deferred")) != 4 || testutil.ToFloat64(m.DeferredCharges) != 6 ||
		testutil.ToFloat64(m.StoreErrors.WithLabelValues("charge", "timeout")) != 1 {
		t.Fatal("charge events not recorded")
	}
	for err, want := range map[error]string{store.ErrOverflow: "malformed_reply", store.ErrFull: "full", store.ErrRefused: "other", errors.New("x"): "other"} {
		if got := ErrReason(err); got != want {
			t.Errorf("ErrReason(%v) = %s, want %s", err, got, want)
		}
	}
}
