package metrics

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// UsageMetric is the gauge of the top principals' usage ratio per budget.
const UsageMetric = "ratelimit_budget_usage_ratio"

// Usage exports, per budget (BudgetLabels), the usage ratio (counter / cap)
// of the N principals closest to their cap in the current window, as this
// replica saw them in its store calls: rank="1" is the highest, so "how close
// is anyone to the cap" is max by (budget) (ratelimit_budget_usage_ratio).
// No principal is named: the rank is the only per-principal label, bounded
// by N. A budget nobody used in the window reports rank 1 at 0. Read at
// scrape time; a window that has ended reports 0 until the next call.
type Usage struct {
	n    int
	now  func() time.Time
	desc *prometheus.Desc

	mu       sync.Mutex
	trackers map[BudgetKey]*Top
}

func newUsage(o Options) *Usage {
	n := o.TopPrincipals
	if n == 0 {
		n = DefaultTopPrincipals
	}
	if n < 0 {
		return nil
	}
	n = min(n, MaxTopPrincipals)
	now := o.Now
	if now == nil {
		now = time.Now
	}
	return &Usage{n: n, now: now, trackers: map[BudgetKey]*Top{},
		desc: prometheus.NewDesc(UsageMetric,
			"Usage ratio (counter / cap) of the principals closest to their cap in the budget's current window, rank 1 the highest; no principal label.",
			append(BudgetLabels[:len(BudgetLabels):len(BudgetLabels)], "rank"), nil)}
}

// Tracker returns (creating it) the tracker of a budget; nil when u is nil
// (the gauge is off).
func (u *Usage) Tracker(b BudgetKey) *Top {
	if u == nil {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	t := u.trackers[b]
	if t == nil {
		t = newTop(u.n)
		u.trackers[b] = t
	}
	return t
}

// Retain drops the trackers of budgets not in keep (they left the config),
// and so their series.
func (u *Usage) Retain(keep map[BudgetKey]bool) {
	if u == nil {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for b := range u.trackers {
		if !keep[b] {
			delete(u.trackers, b)
		}
	}
}

// Describe implements prometheus.Collector.
func (u *Usage) Describe(ch chan<- *prometheus.Desc) { ch <- u.desc }

// Collect implements prometheus.Collector.
func (u *Usage) Collect(ch chan<- prometheus.Metric) {
	now := u.now().Unix()
	u.mu.Lock()
	keys := make([]BudgetKey, 0, len(u.trackers))
	tops := make([]*Top, 0, len(u.trackers))
	for b, t := range u.trackers {
		keys, tops = append(keys, b), append(tops, t)
	}
	u.mu.Unlock()
	for i, t := range tops {
		ratios := t.Ratios(now)
		if len(ratios) == 0 {
			ratios = []float64{0}
		}
		v := keys[i].values()
		for r, x := range ratios {
			ch <- prometheus.MustNewConstMetric(u.desc, prometheus.GaugeValue, x, append(v, strconv.Itoa(r+1))...)
		}
	}
}

// Top keeps the n highest usage ratios of one budget's principals in its
// current window. A principal's counter only grows within a window, so
// keeping the n highest values seen, each principal once, is exact: a
// principal outside the top n can only enter it with a value above its
// lowest, and then it replaces the lowest. Safe for concurrent use.
type Top struct {
	n int
	// floor is the lowest ratio kept (float64 bits) once n are kept, else 0;
	// window is the window start they belong to. Together they let most
	// observations return without the lock.
	floor  atomic.Uint64
	window atomic.Int64

	mu         sync.Mutex
	start, end int64
	ids        []uint64
	ratios     []float64
}

func newTop(n int) *Top {
	t := &Top{n: n, ids: make([]uint64, 0, n), ratios: make([]float64, 0, n)}
	t.window.Store(math.MinInt64)
	return t
}

// Observe records that principal id's counter is at ratio of its cap in
// the window [start, end) (Unix seconds). A later window resets the top; an
// earlier one is ignored.
func (t *Top) Observe(id uint64, ratio float64, start, end int64) {
	if t == nil || math.IsNaN(ratio) || ratio < 0 {
		return
	}
	if start == t.window.Load() && ratio < math.Float64frombits(t.floor.Load()) {
		return // below the lowest of a full top: not a top principal
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case start < t.start:
		return
	case start > t.start || t.end == 0:
		t.start, t.end = start, end
		t.ids, t.ratios = t.ids[:0], t.ratios[:0]
		t.floor.Store(0)
		t.window.Store(start)
	}
	t.insert(id, ratio)
}

// insert updates id or replaces the lowest kept value (t.mu held).
func (t *Top) insert(id uint64, ratio float64) {
	low := -1
	for i, x := range t.ids {
		if x == id {
			t.ratios[i] = max(t.ratios[i], ratio)
			t.setFloor()
			return
		}
		if low < 0 || t.ratios[i] < t.ratios[low] {
			low = i
		}
	}
	switch {
	case len(t.ids) < t.n:
		t.ids, t.ratios = append(t.ids, id), append(t.ratios, ratio)
	case ratio > t.ratios[low]:
		t.ids[low], t.ratios[low] = id, ratio
	default:
		return
	}
	t.setFloor()
}

func (t *Top) setFloor() {
	if len(t.ids) < t.n {
		t.floor.Store(0)
		return
	}
	t.floor.Store(math.Float64bits(slices.Min(t.ratios)))
}

// Ratios returns the kept ratios, highest first; none when the window ended
// before now (Unix seconds).
func (t *Top) Ratios(now int64) []float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now >= t.end {
		return nil
	}
	out := slices.Clone(t.ratios)
	slices.SortFunc(out, func(a, b float64) int {
		switch {
		case a > b:
			return -1
		case a < b:
			return 1
		}
		return 0
	})
	return out
}
