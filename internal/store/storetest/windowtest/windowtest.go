// Package windowtest is the part of the store behaviour suite that needs the
// decision pipeline: counters across calendar window boundaries, driven with
// an injected clock through decide (plan, answer) and charge, the packages
// the engine composes, never the engine itself (a store's tests sit below
// it). It lives apart from storetest because charge and decide are not the
// store's concern; call it from a store's external test package.
package windowtest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/budgetgen/budgetgen/internal/ratelimit/charge"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
	"github.com/budgetgen/budgetgen/internal/store"
)

// NewStore returns a fresh store for one sub-test; the suite closes it.
type NewStore func(t *testing.T) store.Store

// Run runs the window tests against stores made by newStore, with keys of
// their own (a shared server is fine).
func Run(t *testing.T, newStore NewStore) {
	t.Run("CalendarMonthBoundary", func(t *testing.T) {
		s := newStore(t)
		t.Cleanup(func() { _ = s.Close() })
		testMonthBoundary(t, s, fmt.Sprintf("windowtest:%d:", time.Now().UnixNano()))
	})
}

// monthConfig: 10 hits per calendar month per user.
const monthConfig = `domain: d
descriptors:
  - key: user
    rate_limit: {unit: month, requests_per_unit: 10}
`

// pipeline decides requests as the engine does (plan, charge, answer), with
// FAILURE_POLICY=error so a store failure is an error, never an answer.
type pipeline struct {
	planner decide.Planner
	charger *charge.Charger
	cfg     *config.Config
	now     func() time.Time
	plan    decide.Scratch
	charge  charge.Scratch
}

func newPipeline(t *testing.T, s store.Store, w window.Windows, prefix string, cfg *config.Config, now func() time.Time) *pipeline {
	t.Helper()
	c, err := charge.New(charge.Options{Store: s, Now: now, BatchWorkers: -1, StoreTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() }) // test cleanup; the assertions check behaviour
	return &pipeline{planner: decide.Planner{Keys: key.Encoder{Prefix: prefix}, Windows: w}, charger: c, cfg: cfg, now: now}
}

func (p *pipeline) ShouldRateLimit(ctx context.Context, req *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
	now := p.now()
	items := p.planner.Plan(p.cfg, req, now, &p.plan)
	err := p.charger.Charge(ctx, items, now, &p.charge, nil)
	resp, _, err := decide.Answer(items, err, now.Unix(), decide.Policy{Failure: decide.FailError})
	return resp, err
}

// testMonthBoundary drives the decision pipeline over the store with an
// injected clock across a calendar month boundary: the month's counter fills
// and denies until the last second of the month, the first second of the
// next month starts a new counter, duration_until_reset counts down to the
// 1st (not to a 30-day epoch boundary), and the old month's counter is still
// whole (it expires at its window end plus grace, not a sliding TTL).
//
// The boundary is the next one after the real time, because a Valkey server
// expires keys on its own clock: every expiry the pipeline sets is then in the
// future.
func testMonthBoundary(t *testing.T, s store.Store, prefix string) {
	w, err := window.New(window.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, boundary, _ := w.Bounds(window.Month, time.Now().Unix())
	var clock atomic.Int64
	clock.Store(boundary - 2)
	cfg, err := config.Load([]config.File{{Name: "month.yaml", Data: []byte(monthConfig)}})
	if err != nil {
		t.Fatal(err)
	}
	now := func() time.Time { return time.Unix(clock.Load(), 0) }
	e := newPipeline(t, s, w, prefix, cfg, now)
	ask := func(hits uint64) *rlpb.RateLimitResponse_DescriptorStatus {
		t.Helper()
		resp, err := e.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}, HitsAddend: wrap(hits)}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0]
	}
	if st := ask(10); st.Code != rlpb.RateLimitResponse_OK || st.LimitRemaining != 0 || st.DurationUntilReset.GetSeconds() != 2 {
		t.Fatalf("10 of 10 at the month's end - 2 s: %v remaining %d reset in %v, want OK, 0, 2 s", st.Code, st.LimitRemaining, st.DurationUntilReset.AsDuration())
	}
	clock.Store(boundary - 1)
	if st := ask(1); st.Code != rlpb.RateLimitResponse_OVER_LIMIT || st.DurationUntilReset.GetSeconds() != 1 {
		t.Fatalf("11th hit in the month's last second: %v reset in %v, want OVER_LIMIT in 1 s", st.Code, st.DurationUntilReset.AsDuration())
	}
	clock.Store(boundary)
	next, nextEnd, _ := w.Bounds(window.Month, boundary)
	if st := ask(1); st.Code != rlpb.RateLimitResponse_OK || st.LimitRemaining != 9 || st.DurationUntilReset.GetSeconds() != nextEnd-next {
		t.Fatalf("first hit of the new month: %v remaining %d reset in %v, want OK, 9, %d s (the whole month)", st.Code, st.LimitRemaining, st.DurationUntilReset.AsDuration(), nextEnd-next)
	}
	e.charger.Flush() // the over-limit cache's deferred hit of the old month
	prev, _, _ := w.Bounds(window.Month, boundary-1)
	old := key.Encoder{Prefix: prefix}.Append(nil, "d", []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}, nil, boundary-prev, prev)
	totals := []store.Result{{}}
	if err := s.Charge(context.Background(), []store.Counter{{Key: string(old), ExpireAt: time.Now().Add(time.Hour)}}, totals); err != nil {
		t.Fatal(err)
	}
	if got := totals[0].Total; got != 11 {
		t.Fatalf("old month's counter = %d, want 11 (10 + the denied hit, charged as the reference does)", got)
	}

	// The same instants with the reference's epoch windows: no reset on the
	// 1st, the reset is the next 30-day multiple since 1970.
	ep, err := window.New(window.Options{Mode: window.Epoch})
	if err != nil {
		t.Fatal(err)
	}
	clock.Store(boundary - 2)
	e = newPipeline(t, s, ep, prefix+"epoch:", cfg, now)
	const div = 30 * 86400
	if st := ask(4); st.LimitRemaining != 6 || st.DurationUntilReset.GetSeconds() != div-(boundary-2)%div {
		t.Fatalf("epoch: remaining %d reset in %d s, want 6 and %d s", st.LimitRemaining, st.DurationUntilReset.GetSeconds(), div-(boundary-2)%div)
	}
	clock.Store(boundary)
	if (boundary-2)/div == boundary/div { // same epoch window: no reset at the 1st
		if st := ask(1); st.LimitRemaining != 5 {
			t.Fatalf("epoch: remaining %d after the 1st, want 5 (the 30-day window goes on)", st.LimitRemaining)
		}
	}
}

func wrap(v uint64) *wrapperspb.UInt64Value { return wrapperspb.UInt64(v) }
