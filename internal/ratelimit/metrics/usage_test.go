package metrics

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestTopIsExact: over random streams in which each principal's counter
// only grows within a window (as a counter does), Top keeps exactly the n
// highest current ratios, compared with a brute-force model.
func TestTopIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		n := 1 + rng.IntN(6)
		top := newTop(n)
		model := map[uint64]float64{}
		principals := 1 + rng.IntN(20)
		for range 300 {
			id := uint64(rng.IntN(principals))
			model[id] += rng.Float64()
			top.Observe(id, model[id], 100, 200)
		}
		want := make([]float64, 0, len(model))
		for _, v := range model {
			want = append(want, v)
		}
		slices.Sort(want)
		slices.Reverse(want)
		want = want[:min(n, len(want))]
		if got := top.Ratios(150); !slices.Equal(got, want) {
			t.Fatalf("round %d (n=%d, %d principals): top %v, want %v", round, n, principals, got, want)
		}
	}
}

// TestTopWindows: a later window starts empty; an earlier window's late
// observation is ignored; an ended window reports nothing.
func TestTopWindows(t *testing.T) {
	top := newTop(3)
	top.Observe(1, 0.5, 100, 200)
	top.Observe(2, 0.7, 200, 300)
	top.Observe(3, 0.9, 100, 200) // late, from the previous window
	if got := top.Ratios(250); !slices.Equal(got, []float64{0.7}) {
		t.Fatalf("after the window moved: %v", got)
	}
	if got := top.Ratios(300); got != nil {
		t.Fatalf("after the window ended: %v", got)
	}
}

// TestTopConcurrent: concurrent observers (the lock-free floor check among
// them) keep the exact top of monotonic per-principal streams.
func TestTopConcurrent(t *testing.T) {
	top := newTop(4)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= 500; i++ {
				top.Observe(uint64(g), float64(i*(g+1)), 100, 200)
			}
		}()
	}
	wg.Wait()
	if got := top.Ratios(150); !slices.Equal(got, []float64{4000, 3500, 3000, 2500}) {
		t.Fatalf("top %v", got)
	}
}

// TestPrecreatedAtZero: every fixed-label counter exists at zero before
// anything happened, so an alert on an increase can fire on a fresh pod.
func TestPrecreatedAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewWith(reg, Options{})
	want := map[string]int{
		"ratelimit_requests_total":         len(RequestCodes),
		"ratelimit_store_errors_total":     len(StoreOps) * len(StoreErrorReasons),
		"ratelimit_failure_policy_total":   len(FailurePolicies),
		"ratelimit_config_loads_total":     len(ConfigSources) * len(ConfigResults),
		"ratelimit_over_limit_cache_total": len(CacheResults),
		"ratelimit_unsent_hits_total":      len(UnsentOutcomes),
		"ratelimit_store_call_seconds":     len(StoreOps),
	}
	for name, n := range want {
		if got := testutil.CollectAndCount(reg, name); got != n {
			t.Errorf("%s: %d series at start, want %d", name, got, n)
		}
	}
}

// TestTopPrincipalsBound: the gauge is off below zero and N is capped.
func TestTopPrincipalsBound(t *testing.T) {
	if u := newUsage(Options{TopPrincipals: -1}); u != nil {
		t.Fatal("negative N did not turn the gauge off")
	}
	if u := newUsage(Options{TopPrincipals: 1 << 20}); u.n != MaxTopPrincipals {
		t.Fatalf("N = %d, want the cap %d", u.n, MaxTopPrincipals)
	}
	if u := newUsage(Options{}); u.n != DefaultTopPrincipals {
		t.Fatalf("default N = %d", u.n)
	}
}

// TestConfigLastLoad: the gauge has no series for a source that never
// loaded (no false alert), is 0 from a source's first rejected load on (a
// rejection at startup included) and 1 again after a good one.
func TestConfigLastLoad(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewWith(reg, Options{})
	if n := testutil.CollectAndCount(reg, "ratelimit_config_last_load_success"); n != 0 {
		t.Fatalf("%d series before any load, want 0", n)
	}
	m.ConfigLoaded("xds", errors.New("bad snapshot"))
	m.ConfigLoaded("file", nil)
	if got := testutil.ToFloat64(m.ConfigLastLoad.WithLabelValues("xds")); got != 0 {
		t.Errorf("xds rejected at start: gauge %v, want 0", got)
	}
	if got := testutil.ToFloat64(m.ConfigLastLoad.WithLabelValues("file")); got != 1 {
		t.Errorf("file loaded: gauge %v, want 1", got)
	}
	m.ConfigLoaded("xds", nil)
	if got := testutil.ToFloat64(m.ConfigLastLoad.WithLabelValues("xds")); got != 1 {
		t.Errorf("xds loaded after a rejection: gauge %v, want 1", got)
	}
}
