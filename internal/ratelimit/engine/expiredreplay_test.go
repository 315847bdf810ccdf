package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/observe"
	"github.com/budgetgen/budgetgen/internal/ratelimit/storemetrics"
	"github.com/budgetgen/budgetgen/internal/store"
	valkeystore "github.com/budgetgen/budgetgen/internal/store/valkey"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// lateCharges hands calls that charge hits to the Valkey store only once
// their deadline has passed, while late is set: the store sends nothing
// (store.ErrNotSent) and the charger defers them to the outage buffer.
type lateCharges struct {
	*valkeystore.Store
	late atomic.Bool
}

func (l *lateCharges) Charge(ctx context.Context, cs []store.Counter, rs []store.Result) error {
	if l.late.Load() && len(cs) > 0 && cs[0].Hits > 0 {
		<-ctx.Done()
	}
	return l.Store.Charge(ctx, cs, rs)
}

// TestReplayedReleaseCountsExpiredHolds: the tokens of holds that a
// request's release finds expired are counted in
// ratelimit_reservation_expired_tokens_total under the request's budget,
// whether the release reached Valkey in its request's call or later,
// replayed from the outage buffer. The replay's were discarded. Holds live
// 10 s (RESERVATION_EXPIRY; two 5 s generations): A's check holds 5 tokens
// at 0 s, B's at 6 s; B's charge misses its deadline at 11 s and is
// buffered; its replay finds A's 5 tokens expired.
func TestReplayedReleaseCountsExpiredHolds(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	start := time.Now()
	if next := start.Truncate(24 * time.Hour).Add(24 * time.Hour); next.Sub(start) < time.Minute {
		start = next.Add(time.Minute) // the day window must not end during the test
	}
	var clock atomic.Int64
	clock.Store(start.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	vs, err := valkeystore.New(valkeystore.Options{Addresses: []string{srv.Addr}, ReplayInterval: 10 * time.Millisecond, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vs.Close() })
	st := &lateCharges{Store: vs}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	storemetrics.Register(reg, vs)
	e, err := New(Options{Store: st, Now: now, HoldExpiry: 10 * time.Second, OverLimitCacheSize: -1,
		StoreTimeout: 20 * time.Millisecond, Observers: []observe.Observer{observe.NewMetrics(m)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	c, err := config.Merge(func(string, []config.PathEntry) config.Resolved {
		return config.Resolved{Budget: &config.Budget{Name: "per-run", Kind: "tokens", Window: "day", Mode: metrics.ModeEnforce,
			Gateway: "agentgateway:agents/gw", Bucket: "s/per-run", Reserve: config.Reserve{Tokens: 5}}}
	}, mustConfig(t, "domain: d\ndescriptors:\n  - key: run\n    rate_limit: {unit: day, requests_per_unit: 100}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e.SetConfig(c)
	expired := m.ForReservation(metrics.BudgetKey{Budget: "per-run", Window: "day", Mode: metrics.ModeEnforce, Gateway: "agentgateway:agents/gw"}).ExpiredTokens
	call := func(at time.Duration, hits uint64) {
		t.Helper()
		clock.Store(start.Add(at).UnixNano())
		if _, err := e.ShouldRateLimit(context.Background(), req("d", 0, withHits(d("run", "r1"), hits))); err != nil {
			t.Fatal(err)
		}
	}
	call(0, 0)               // A's check: holds 5
	call(6*time.Second, 0)   // B's check: holds 5; A's generation is now the older
	st.late.Store(true)      // B's charge misses its deadline: buffered
	call(11*time.Second, 30) // A's generation has expired by now
	if !waitFor(5*time.Second, func() bool { s := vs.Stats(); return s.Buffered > 0 && s.BufferKeys == 0 && s.InFlight == 0 }) {
		t.Fatalf("B's charge was not buffered and replayed: %+v", vs.Stats())
	}
	if got := testutil.ToFloat64(expired); got != 5 {
		t.Errorf("ratelimit_reservation_expired_tokens_total = %v after the replayed release found A's 5 tokens expired; want 5", got)
	}
	if y := vs.Tally(); y.Get(store.TargetRelease, store.Replayed) != 1 {
		t.Errorf("releases replayed: %d, want B's 1", y.Get(store.TargetRelease, store.Replayed))
	}
}
