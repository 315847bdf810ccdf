package report

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/budgetgen/budgetgen/internal/ledger"
)

// population accumulates one set of principals judged against one cap: a
// cap's default-rule principals, or one override principal.
type population struct {
	windows    []judgedWindow
	acc        []windowAcc
	seen       map[string]bool
	samples    []sample
	principals map[string]*principalAcc
}

// sample is one principal-window's usage.
type sample struct {
	principal string
	window    int
	value     uint64
}

type principalAcc struct {
	cap       uint64
	perWindow map[int]uint64
	denials   map[int]ledger.Denials
	maxWindow uint64
	hasOver   bool
}

// windowAcc accumulates one window's principal-windows.
type windowAcc struct {
	values     []uint64
	principals map[string]bool
	total      uint64
	over       int
	above      uint64
	denials    ledger.Denials
	holds      ledger.Holds
	// principalShadow sums the principals' own would-be 429 counts: equal
	// to denials.Shadow when the ledger has every principal's.
	principalShadow uint64
	overNames       map[string]bool
}

func newPopulation(ws []judgedWindow) *population {
	return &population{windows: ws, acc: make([]windowAcc, len(ws)), seen: map[string]bool{}, principals: map[string]*principalAcc{}}
}

func (p *population) principal(name string) *principalAcc {
	pa := p.principals[name]
	if pa == nil {
		pa = &principalAcc{perWindow: map[int]uint64{}, denials: map[int]ledger.Denials{}}
		p.principals[name] = pa
	}
	return pa
}

// add records a principal's usage in window i against capv (0: unknown).
func (p *population) add(i int, name string, used, capv uint64) {
	w := &p.acc[i]
	w.add(used, capv)
	w.principals[name] = true
	p.seen[name] = true
	p.samples = append(p.samples, sample{name, i, used})
	pa := p.principal(name)
	pa.cap = capv
	pa.perWindow[i] += used
	pa.maxWindow = max(pa.maxWindow, pa.perWindow[i])
	if capv > 0 && used > capv {
		pa.hasOver = true
		if w.overNames == nil {
			w.overNames = map[string]bool{}
		}
		w.overNames[name] = true
	}
}

// deny records a rule's denials in window i: the window's totals, and each
// principal's own.
func (p *population) deny(i int, total ledger.Denials, per map[string]ledger.Denials, name func(string) string) {
	w := &p.acc[i]
	w.denials.Add(total)
	for field, d := range per {
		w.principalShadow += d.Shadow
		pa := p.principal(name(field))
		cur := pa.denials[i]
		cur.Add(d)
		pa.denials[i] = cur
	}
}

// hold records a rule's reservations in window i (totals: no principal).
func (p *population) hold(i int, h ledger.Holds) { p.acc[i].holds.Add(h) }

func (w *windowAcc) add(used, capv uint64) {
	if w.principals == nil {
		w.principals = map[string]bool{}
	}
	w.values = append(w.values, used)
	w.total += used
	// The service denies when the counter after adding is above the limit.
	if capv > 0 && used > capv {
		w.over++
		w.above += used - capv
	}
}

func (w *windowAcc) merge(o *windowAcc) {
	w.values = append(w.values, o.values...)
	w.total += o.total
	w.over += o.over
	w.above += o.above
	w.denials.Add(o.denials)
	w.holds.Add(o.holds)
}

func (w *windowAcc) stats() Stats {
	v := append([]uint64(nil), w.values...)
	slices.Sort(v)
	s := Stats{
		PrincipalWindows: len(v), Principals: len(w.principals), Total: w.total,
		OverCap: w.over, AboveCap: w.above, Would429: w.denials.Shadow, Denied: w.denials.Enforce, ReserveDenied: w.denials.Reserve,
		Holds: w.holds.Count, Held: w.holds.Held, Expired: w.holds.Expired,
		P50: Percentile(v, 50), P95: Percentile(v, 95), P99: Percentile(v, 99),
	}
	if len(v) > 0 {
		s.Max = v[len(v)-1]
		s.LimitedShare = float64(w.over) / float64(len(v))
	}
	return s
}

// populationResult is a finished population.
type populationResult struct {
	perWindow    []WindowStats
	summary      Stats
	covered      int
	daysCovered  int
	distribution []uint64
	peaks        []uint64
	over         []PrincipalOver
	outliers     []Outlier
}

// finish computes the population's numbers; pl gives the report's days in
// its zone, which daysCovered counts.
func (p *population) finish(capv uint64, pl plan) populationResult {
	var res populationResult
	var sum windowAcc
	sum.principals = p.seen
	reportDays := map[ledger.Day]bool{}
	for _, d := range pl.days {
		reportDays[d.Day] = true
	}
	days := map[ledger.Day]bool{}
	for i, jw := range p.windows {
		ws := p.acc[i].stats()
		res.perWindow = append(res.perWindow, WindowStats{Window: jw.w.String(), Partial: jw.partial, Stats: ws})
		if !jw.partial && (ws.PrincipalWindows > 0 || ws.Would429 > 0 || ws.Denied > 0) {
			res.covered++
			// An hour window is named by its UTC date (hours are
			// epoch-aligned), not by the day of the report's zone it falls
			// in: count the local day it starts in, and only the report's
			// days, so 6 local days of hours never read as 7 UTC dates.
			if d := ledger.WindowAt(ledger.PeriodDay, jw.w.Start(pl.loc), pl.loc).Day; jw.w.Period != ledger.PeriodHour || reportDays[d] {
				days[d] = true
			}
		}
		sum.merge(&p.acc[i])
	}
	res.daysCovered = len(days)
	res.summary = sum.stats()
	res.outliers = p.outliers(capv)
	out := map[sample]bool{}
	for _, o := range res.outliers {
		out[sample{o.Principal, windowIndex(p.windows, o.Window), o.Value}] = true
	}
	for _, s := range p.samples {
		if !out[s] {
			res.distribution = append(res.distribution, s.value)
		}
	}
	slices.Sort(res.distribution)
	for name, pa := range p.principals {
		if len(pa.perWindow) > 0 {
			res.peaks = append(res.peaks, pa.maxWindow)
		}
		if pa.hasOver {
			res.over = append(res.over, p.overOf(name, pa))
		}
	}
	slices.Sort(res.peaks)
	sort.Slice(res.over, func(i, j int) bool {
		a, b := res.over[i], res.over[j]
		if a.AboveCap != b.AboveCap {
			return a.AboveCap > b.AboveCap
		}
		return a.Principal < b.Principal
	})
	return res
}

// overOf is one principal's windows over its cap and its would-be 429s.
func (p *population) overOf(name string, pa *principalAcc) PrincipalOver {
	po := PrincipalOver{Principal: name, Cap: pa.cap, MaxWindow: pa.maxWindow, Would429Exact: true}
	for i, jw := range p.windows {
		po.Would429 += pa.denials[i].Shadow
		// Denials the ledger has no principal for (a shared bucket, a
		// recorder past its bound, older data) are this principal's when it
		// was the only one over the cap that window.
		if w := &p.acc[i]; w.principalShadow < w.denials.Shadow {
			if len(w.overNames) == 1 && w.overNames[name] {
				po.Would429 += w.denials.Shadow - w.principalShadow
			} else {
				po.Would429Exact = false
			}
		}
		used, ok := pa.perWindow[i]
		if !ok || pa.cap == 0 || used <= pa.cap {
			continue
		}
		po.WindowsOver = append(po.WindowsOver, jw.w.String())
		po.AboveCap += used - pa.cap
	}
	return po
}

// outliers are principal-windows above OutlierFactor times the 95th
// percentile (the median with fewer than MinPrincipalsForPercentile
// values) and above the cap, largest first.
func (p *population) outliers(capv uint64) []Outlier {
	if len(p.samples) < 3 {
		return nil
	}
	v := make([]uint64, len(p.samples))
	for i, s := range p.samples {
		v[i] = s.value
	}
	slices.Sort(v)
	base := Percentile(v, 95)
	if len(v) < MinPrincipalsForPercentile {
		base = Percentile(v, 50)
	}
	limit := max(base, 1) * OutlierFactor
	var out []Outlier
	for _, s := range p.samples {
		if s.value > limit && (capv == 0 || s.value > capv) {
			out = append(out, Outlier{Principal: s.principal, Window: p.windows[s.window].w.String(), Value: s.value, Cap: capv})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Value != out[j].Value {
			return out[i].Value > out[j].Value
		}
		return out[i].Principal+out[i].Window < out[j].Principal+out[j].Window
	})
	return out
}

func windowIndex(ws []judgedWindow, name string) int {
	for i, jw := range ws {
		if jw.w.String() == name {
			return i
		}
	}
	return -1
}

// suggest picks a cap for a population of principal-windows and says why.
// Many principals: the smallest cap limiting at most the target share of
// principal-windows (SuggestCap). A shared bucket, few principals or too few
// principal-windows for the share to allow any: the peak times the
// headroom, never the peak itself.
func suggest(values []uint64, principals int, shared bool, o Options) (uint64, string) {
	n := len(values)
	peak := slices.Max(values)
	switch {
	case shared:
		return suggestPeak(peak, "shared bucket (one counter for the whole group)", o.Headroom)
	case principals < MinPrincipalsForPercentile:
		return suggestPeak(peak, fmt.Sprintf("%d principals, too few for a percentile (fewer than %d)", principals, MinPrincipalsForPercentile), o.Headroom)
	}
	c := SuggestCap(values, o.TargetLimitedShare)
	if c >= peak {
		return suggestPeak(peak, fmt.Sprintf("%d principal-windows, too few for a %s share to allow any above the cap", n, pct(o.TargetLimitedShare)), o.Headroom)
	}
	above := 0
	for _, v := range values {
		if v > c {
			above++
		}
	}
	return c, fmt.Sprintf("smallest cap with at most %s of %d principal-windows above it (%d above, %d principals)", pct(o.TargetLimitedShare), n, above, principals)
}

// suggestPeak is peak x headroom rounded up to two significant digits.
func suggestPeak(peak uint64, why string, headroom float64) (uint64, string) {
	c := roundUp2(uint64(math.Ceil(float64(peak) * headroom)))
	if c <= peak {
		c = peak + 1
	}
	return c, fmt.Sprintf("observed peak %s x headroom %.2f: %s", group(peak), headroom, why)
}

// roundUp2 rounds v up to two significant digits (6281480 -> 6300000), so a
// suggestion reads as a chosen number, not a measured one.
func roundUp2(v uint64) uint64 {
	if v < 100 {
		return v
	}
	unit := uint64(1)
	for v/unit >= 100 {
		unit *= 10
	}
	if v%unit == 0 {
		return v
	}
	return (v/unit + 1) * unit
}

// Percentile is the nearest-rank percentile of sorted values (0 when empty):
// the smallest value with at least p% of the values at or below it.
func Percentile(sorted []uint64, p int) uint64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := (p*n + 99) / 100 // ceil(p/100*n)
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

// SuggestCap returns the smallest cap C such that at most share of the
// values are above C (the service denies above the cap, not at it). values
// need not be sorted. 0 when there are none.
func SuggestCap(values []uint64, share float64) uint64 {
	n := len(values)
	if n == 0 {
		return 0
	}
	v := append([]uint64(nil), values...)
	slices.Sort(v)
	k := int(math.Floor(share*float64(n) + 1e-9)) // values allowed above
	if k >= n {
		k = n - 1
	}
	return v[n-1-k]
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
