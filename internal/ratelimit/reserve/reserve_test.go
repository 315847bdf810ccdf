package reserve

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
)

func auto(bucket string, initial uint64) *config.Budget {
	return &config.Budget{Name: bucket, Bucket: bucket, Reserve: config.Reserve{Auto: true, Initial: initial}}
}

// TestSizeFixedAndNone: a fixed reserve is held as given, whatever was
// charged; a budget without a reserve (or no budget) holds nothing.
func TestSizeFixedAndNone(t *testing.T) {
	var l Learner
	fixed := &config.Budget{Bucket: "b", Reserve: config.Reserve{Tokens: 50_000}}
	for range 100 {
		l.Observe(fixed, 7)
	}
	if got := l.Size(fixed); got != 50_000 {
		t.Errorf("fixed: %d, want 50000", got)
	}
	if got := l.Size(&config.Budget{Bucket: "b"}); got != 0 {
		t.Errorf("no reserve: %d, want 0", got)
	}
	if got := l.Size(nil); got != 0 {
		t.Errorf("no budget: %d, want 0", got)
	}
}

// TestAutoLearnsThePercentile: reserveInitial until MinSamples charges,
// then the nearest-rank 95th percentile of the recent charges; zero charges
// (a check, or a count-less stream end) teach nothing.
func TestAutoLearnsThePercentile(t *testing.T) {
	var l Learner
	b := auto("run", 20_000)
	for i := range MinSamples - 1 {
		l.Observe(b, 50_000+uint64(i))
		l.Observe(b, 0)
		if got := l.Size(b); got != 20_000 {
			t.Fatalf("after %d charges: %d, want reserveInitial 20000", i+1, got)
		}
	}
	l.Observe(b, 50_000)
	if got := l.Size(b); got < 50_000 || got > 50_000+MinSamples {
		t.Fatalf("after %d charges of about 50000: %d", MinSamples, got)
	}
	// 1..128: the estimate is refreshed at 128, the 95th percentile by
	// nearest rank is the 122nd value.
	c := auto("cost", 1)
	for i := uint64(1); i <= 128; i++ {
		l.Observe(c, i)
	}
	if got := l.Size(c); got != 122 {
		t.Errorf("p95 of 1..128 = %d, want 122", got)
	}
	// Budgets learn apart.
	if got := l.Size(auto("other", 9)); got != 9 {
		t.Errorf("an unseen budget: %d, want its reserveInitial", got)
	}
}

// TestAutoFollowsTheWindow: only the last Window charges count, so a budget
// whose calls grew holds the new size once they fill the window.
func TestAutoFollowsTheWindow(t *testing.T) {
	var l Learner
	b := auto("run", 1)
	for range Window {
		l.Observe(b, 1_000)
	}
	if got := l.Size(b); got != 1_000 {
		t.Fatalf("small calls: %d", got)
	}
	for range Window {
		l.Observe(b, 80_000)
	}
	if got := l.Size(b); got != 80_000 {
		t.Errorf("after a window of larger calls: %d, want 80000", got)
	}
}

// TestForget: a reload that drops a rule drops what was learned of it.
func TestForget(t *testing.T) {
	var l Learner
	keep, drop := auto("keep", 5), auto("drop", 5)
	for range MinSamples {
		l.Observe(keep, 100)
		l.Observe(drop, 100)
	}
	l.Forget(func(learns string) bool { return learns == keep.Learns() })
	if got := l.Size(keep); got != 100 {
		t.Errorf("kept: %d, want 100", got)
	}
	if got := l.Size(drop); got != 5 {
		t.Errorf("forgotten: %d, want reserveInitial 5", got)
	}
}

// TestConcurrentObserve: charges observed from many goroutines are all
// counted (run under -race by the suite).
func TestConcurrentObserve(t *testing.T) {
	var l Learner
	b := auto("run", 1)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 64 {
				l.Observe(b, uint64(1000*(g+1)))
				_ = l.Size(b)
			}
		}()
	}
	wg.Wait()
	v, _ := l.budgets.Load(b.Learns())
	if h := v.(*history); h.n != 8*64 {
		t.Errorf("%d charges counted, want %d", h.n, 8*64)
	}
	if got := l.Size(b); got != 8_000 {
		t.Errorf("p95 of 8 equal groups 1000..8000 = %d, want 8000", got)
	}
}

// TestSelectNthMatchesSort: the linear-time selection picks what a sort
// would put at each rank, on random, sorted, reversed and constant input.
func TestSelectNthMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	inputs := [][]uint64{{7}, {2, 1}, {5, 5, 5, 5}}
	for _, n := range []int{3, 10, 100, 512} {
		r, asc, desc := make([]uint64, n), make([]uint64, n), make([]uint64, n)
		for i := range r {
			r[i], asc[i], desc[i] = rng.Uint64N(50), uint64(i), uint64(n-i)
		}
		inputs = append(inputs, r, asc, desc)
	}
	for _, in := range inputs {
		sorted := slices.Sorted(slices.Values(in))
		for k := range in {
			if got := selectNth(slices.Clone(in), k); got != sorted[k] {
				t.Fatalf("selectNth(%v, %d) = %d, want %d", in, k, got, sorted[k])
			}
		}
	}
}

// BenchmarkPercentile: one estimate refresh over a full window, by
// selection and (the control) by sorting a copy, as before.
func BenchmarkPercentile(b *testing.B) {
	var h history
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range h.ring {
		h.ring[i] = 200 + rng.Uint64N(4000)
	}
	h.n = Window
	b.Run("select", func(b *testing.B) {
		for b.Loop() {
			_ = h.percentile()
		}
	})
	b.Run("sort", func(b *testing.B) {
		for b.Loop() {
			s := slices.Clone(h.ring[:])
			slices.Sort(s)
			_ = s[(Percentile*len(s)+99)/100-1]
		}
	})
}
