package report

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
)

// Defaults of Options.
const (
	DefaultDays               = 7
	MaxDays                   = ledger.MaxRetentionDays
	DefaultTargetLimitedShare = 0.01
	// DefaultHeadroom multiplies an observed peak when a suggestion is based
	// on it: a cap exactly at last week's peak denies the next busier day.
	DefaultHeadroom = 1.2
	MaxHeadroom     = 10
	// DefaultTopN is how many over-cap principals a budget lists.
	DefaultTopN = 10
	// MinPrincipalsForPercentile: with fewer distinct principals a
	// percentile says little, so the suggestion is the peak times Headroom.
	MinPrincipalsForPercentile = 20
)

// Rule kinds as rendered (render's rule-budgets annotation).
const (
	KindTokens     = "tokens"
	KindKillSwitch = "killswitch"
)

// RuleInfo ties a ledger rule to its budget.
type RuleInfo struct {
	Budget string
	Kind   string // KindTokens or KindKillSwitch
	// Principal is set for an override's own rule: the rule's bucket is that
	// one principal, whose cap is Cap.
	Principal string
	// Cap is the rule's daily limit in tokens (0 when unknown).
	Cap uint64
}

// BudgetInfo is what the spec says about a budget.
type BudgetInfo struct {
	Mode string
	// Cap is the default cap; Overrides the per-principal ones.
	Cap       uint64
	Overrides map[string]uint64
	// Group budgets (group, frontier) have one shared bucket: their
	// principal is the group.
	Group bool
	// Currency is set for a money budget: caps and usage count 1/10,000 of it.
	Currency string
	// Unmeasured, when set, is why the budget can have no measurements (no
	// day cap: the ledger measures day windows); it is the report's NoData.
	Unmeasured string
}

// Mapping is the rule-to-budget map (from the spec via render, or from the
// rendered policies). An empty Mapping reports each rule on its own.
type Mapping struct {
	Rules   map[ledger.RuleID]RuleInfo
	Budgets map[string]BudgetInfo
}

// Options for Build. The zero value reports the 7 days before Now's day
// with a 1% target; Now is required.
type Options struct {
	Now                time.Time
	Days               int     // window length in completed UTC days; default DefaultDays
	TargetLimitedShare float64 // default DefaultTargetLimitedShare
	// IncludeToday adds Now's UTC day, so far, after the completed days,
	// marked partial everywhere.
	IncludeToday bool
	// Headroom multiplies a peak-based suggestion; default DefaultHeadroom,
	// must be within (1, MaxHeadroom].
	Headroom float64
	// TopN bounds the over-cap principals listed per budget; default
	// DefaultTopN.
	TopN int
	// Only restricts the report to these budgets; an unknown name is an error.
	Only []string
}

// ErrUnknownBudget is wrapped when Options.Only names a budget that neither
// the mapping nor the ledger knows.
var ErrUnknownBudget = errors.New("unknown budget")

// Window returns the days a report at now covers: the days completed UTC
// days before now's day, oldest first.
func Window(now time.Time, days int) []ledger.Day {
	today := ledger.DayOf(now)
	out := make([]ledger.Day, days)
	for i := range out {
		out[i] = today - ledger.Day(days-i)
	}
	return out
}

// ReadDays are the days to read from the ledger for a report at now: the
// window and today (read even without IncludeToday, so an empty window can
// say whether today has data).
func ReadDays(now time.Time, days int) []ledger.Day {
	return append(Window(now, days), ledger.DayOf(now))
}

func (o *Options) validate() error {
	if o.Now.IsZero() {
		return errors.New("report: no clock")
	}
	if o.Days == 0 {
		o.Days = DefaultDays
	}
	if o.Days < 1 || o.Days > MaxDays {
		return fmt.Errorf("--days %d: must be within [1, %d] (the ledger keeps at most %d days)", o.Days, MaxDays, MaxDays)
	}
	if o.TargetLimitedShare == 0 {
		o.TargetLimitedShare = DefaultTargetLimitedShare
	}
	if o.TargetLimitedShare <= 0 || o.TargetLimitedShare >= 1 || math.IsNaN(o.TargetLimitedShare) {
		return fmt.Errorf("target share %v: must be within (0, 1)", o.TargetLimitedShare)
	}
	if o.Headroom == 0 {
		o.Headroom = DefaultHeadroom
	}
	if !(o.Headroom > 1 && o.Headroom <= MaxHeadroom) {
		return fmt.Errorf("--headroom %v: must be above 1 (a cap at the peak denies the next busier day) and at most %d", o.Headroom, MaxHeadroom)
	}
	if o.TopN == 0 {
		o.TopN = DefaultTopN
	}
	if o.TopN < 1 {
		return fmt.Errorf("--top %d: must be at least 1", o.TopN)
	}
	return nil
}

// unmappedName names a rule with no budget in the mapping.
func unmappedName(r ledger.RuleID) string { return "rule " + r.Rule }

// population accumulates one set of principals judged against one cap rule:
// a budget's default-rule principals, or one override principal.
type population struct {
	days       []dayAcc
	seen       map[string]bool
	all        []uint64
	principals map[string]*principalAcc
}

type principalAcc struct {
	cap     uint64
	perDay  map[int]uint64 // window index -> usage
	maxDay  uint64
	hasOver bool
}

func newPopulation(n int) *population {
	return &population{days: make([]dayAcc, n), seen: map[string]bool{}, principals: map[string]*principalAcc{}}
}

func (p *population) add(i int, name string, used, capv uint64) {
	day := &p.days[i]
	day.add(used, capv)
	day.principals[name] = true
	p.seen[name] = true
	p.all = append(p.all, used)
	pa := p.principals[name]
	if pa == nil {
		pa = &principalAcc{perDay: map[int]uint64{}}
		p.principals[name] = pa
	}
	pa.cap = capv
	pa.perDay[i] += used
	pa.maxDay = max(pa.maxDay, pa.perDay[i])
	if capv > 0 && used > capv {
		pa.hasOver = true
		if day.overNames == nil {
			day.overNames = map[string]bool{}
		}
		day.overNames[name] = true
	}
}

// Build computes the report from ledger data (any order; days outside the
// window are ignored).
func Build(data []ledger.DayData, m Mapping, o Options) (*Report, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	today := ledger.DayOf(o.Now)
	window := Window(o.Now, o.Days)
	if o.IncludeToday {
		window = append(window, today)
	}
	index := map[ledger.Day]int{}
	for i, d := range window {
		index[d] = i
	}
	complete := o.Days // window entries before the partial day
	r := &Report{
		Version: FormatVersion, GeneratedAt: o.Now.UTC(), Days: o.Days,
		From: window[0].String(), To: window[complete-1].String(), TargetLimitedShare: o.TargetLimitedShare,
		Headroom: o.Headroom, TopN: o.TopN,
	}
	if o.IncludeToday {
		r.PartialDay = today.String()
	}
	type acc struct {
		b         Budget
		def       *population
		overrides map[string]*population
		rules     map[string]bool
		todayData bool   // data today, outside the window (no IncludeToday)
		why       string // BudgetInfo.Unmeasured
	}
	budgets := map[string]*acc{}
	get := func(name string) *acc {
		a := budgets[name]
		if a == nil {
			a = &acc{b: Budget{Name: name}, def: newPopulation(len(window)), overrides: map[string]*population{}, rules: map[string]bool{}}
			if bi, ok := m.Budgets[name]; ok {
				a.b.Mode, a.b.Cap, a.b.Overrides, a.b.Shared, a.b.Currency = bi.Mode, bi.Cap, bi.Overrides, bi.Group, bi.Currency
				a.why = bi.Unmeasured
				for p := range bi.Overrides {
					a.overrides[p] = newPopulation(len(window))
				}
			}
			budgets[name] = a
		}
		return a
	}
	override := func(a *acc, p string) *population {
		if a.overrides[p] == nil {
			a.overrides[p] = newPopulation(len(window))
		}
		return a.overrides[p]
	}
	// Budgets of the spec appear even without data, so a missing week shows.
	for name := range m.Budgets {
		get(name)
	}
	unmapped := map[string]bool{}
	for _, dd := range data {
		info, mapped := m.Rules[dd.Rule]
		if !mapped {
			info = RuleInfo{Budget: unmappedName(dd.Rule), Kind: KindTokens}
		}
		if info.Kind == KindKillSwitch {
			continue // request counts, not tokens
		}
		i, ok := index[dd.Day]
		if !ok {
			if dd.Day == today && (len(dd.Usage) > 0 || dd.ShadowDenials > 0 || dd.EnforceDenials > 0) {
				get(info.Budget).todayData = true
			}
			continue
		}
		if !mapped && len(m.Rules) > 0 {
			unmapped[fmt.Sprintf("rule %s (domain %s) has measurements but no budget in the spec: stale policy or another spec", dd.Rule.Rule, dd.Rule.Domain)] = true
		}
		a := get(info.Budget)
		bi := m.Budgets[info.Budget]
		a.rules[dd.Rule.Rule] = true
		// The rule's denials belong to the population its bucket counts.
		denials := a.def
		if info.Principal != "" {
			denials = override(a, info.Principal)
		}
		denials.days[i].would429 += dd.ShadowDenials
		denials.days[i].denied += dd.EnforceDenials
		for field, used := range dd.Usage {
			name := ledger.PrincipalName(field)
			switch {
			case info.Principal != "":
				capv := info.Cap
				if c, ok := bi.Overrides[info.Principal]; ok && capv == 0 {
					capv = c
				}
				override(a, info.Principal).add(i, info.Principal, used, capv)
				continue
			case bi.Group || field == "":
				if name == "" {
					name = "(group " + info.Budget + ")"
				}
			}
			if c, ok := bi.Overrides[name]; ok {
				override(a, name).add(i, name, used, c)
				continue
			}
			capv := info.Cap
			if capv == 0 {
				capv = bi.Cap
			}
			a.def.add(i, name, used, capv)
		}
	}
	if len(o.Only) > 0 {
		keep := map[string]*acc{}
		for _, name := range o.Only {
			a, ok := budgets[name]
			if !ok {
				return nil, fmt.Errorf("%w %q (known: %v)", ErrUnknownBudget, name, sortedNames(budgets))
			}
			keep[name] = a
		}
		budgets = keep
	}
	anyData, anyToday := false, false
	noDataWhy := func(todayData bool) string {
		switch {
		case o.IncludeToday:
			return fmt.Sprintf("no measurements in %s..%s nor today so far", r.From, r.PartialDay)
		case todayData:
			return fmt.Sprintf("no measurements in %s..%s: the window ends yesterday; today's traffic is not in it, use --include-today", r.From, r.To)
		}
		return fmt.Sprintf("no measurements in %s..%s (the window ends yesterday; today has none either)", r.From, r.To)
	}
	for _, name := range sortedNames(budgets) {
		a := budgets[name]
		pr := a.def.finish(window, complete)
		a.b.PerDay, a.b.Summary, a.b.DaysCovered = pr.perDay, pr.summary, pr.covered
		a.b.Rules = sortedNames(a.rules)
		a.b.Distribution, a.b.PrincipalPeaks = pr.distribution, pr.peaks
		a.b.OverCapPrincipals, a.b.OverCapPrincipalsTotal = pr.over, len(pr.over)
		if len(a.b.OverCapPrincipals) > o.TopN {
			a.b.OverCapPrincipals = a.b.OverCapPrincipals[:o.TopN]
		}
		covered := pr.covered
		if a.b.Summary.PrincipalDays > 0 {
			a.b.SuggestedCap, a.b.SuggestionBasis = suggest(pr.distribution, a.b.Summary.Principals, a.b.Shared, o)
		} else if a.why != "" {
			a.b.NoData = a.why
		} else {
			a.b.NoData = noDataWhy(a.todayData)
		}
		for _, p := range sortedNames(a.overrides) {
			op := a.overrides[p].finish(window, complete)
			ov := Override{Principal: p, Cap: a.b.Overrides[p], DaysCovered: op.covered, Summary: op.summary, PerDay: op.perDay}
			if ov.Cap == 0 && len(op.over) > 0 {
				ov.Cap = op.over[0].Cap
			}
			if ov.Summary.PrincipalDays > 0 {
				ov.SuggestedCap, ov.SuggestionBasis = suggestPeak(op.summary.Max, "one principal with its own cap (override)", o.Headroom)
			} else {
				ov.NoData = noDataWhy(a.todayData)
			}
			covered = max(covered, op.covered)
			a.b.Overridden = append(a.b.Overridden, ov)
		}
		if a.b.Summary.PrincipalDays > 0 || covered > 0 {
			anyData = true
		}
		anyToday = anyToday || a.todayData
		if covered < o.Days {
			r.Warnings = append(r.Warnings, fmt.Sprintf("budget %s: measurements on %d of %d days (%s..%s); a promotion needs 7 full days", name, covered, o.Days, r.From, r.To))
		}
		r.Budgets = append(r.Budgets, a.b)
	}
	if !anyData {
		for _, b := range r.Budgets {
			if b.Summary.PrincipalDays > 0 {
				anyData = true
			}
		}
	}
	if !anyData {
		r.NoData = noDataWhy(anyToday)
	}
	for w := range unmapped {
		r.Warnings = append(r.Warnings, w)
	}
	sort.Strings(r.Warnings)
	return r, nil
}

// populationResult is a finished population.
type populationResult struct {
	perDay       []DayStats
	summary      Stats
	covered      int
	distribution []uint64
	peaks        []uint64
	over         []PrincipalOver
}

func (p *population) finish(window []ledger.Day, complete int) populationResult {
	var res populationResult
	var sum dayAcc
	sum.principals = p.seen
	for i, d := range window {
		ds := p.days[i].stats()
		res.perDay = append(res.perDay, DayStats{Date: d.String(), Partial: i >= complete, Stats: ds})
		if i < complete && (ds.PrincipalDays > 0 || ds.Would429 > 0 || ds.Denied > 0) {
			res.covered++
		}
		sum.merge(&p.days[i])
	}
	res.summary = sum.stats()
	res.distribution = append([]uint64(nil), p.all...)
	sort.Slice(res.distribution, func(i, j int) bool { return res.distribution[i] < res.distribution[j] })
	for name, pa := range p.principals {
		res.peaks = append(res.peaks, pa.maxDay)
		if !pa.hasOver {
			continue
		}
		po := PrincipalOver{Principal: name, Cap: pa.cap, MaxDay: pa.maxDay, Would429Exact: true}
		for i := range window {
			used, ok := pa.perDay[i]
			if !ok || pa.cap == 0 || used <= pa.cap {
				continue
			}
			po.DaysOver = append(po.DaysOver, window[i].String())
			po.TokensAboveCap += used - pa.cap
			if len(p.days[i].overNames) == 1 {
				po.Would429 += p.days[i].would429
			} else if p.days[i].would429 > 0 {
				po.Would429Exact = false
			}
		}
		res.over = append(res.over, po)
	}
	sort.Slice(res.peaks, func(i, j int) bool { return res.peaks[i] < res.peaks[j] })
	sort.Slice(res.over, func(i, j int) bool {
		a, b := res.over[i], res.over[j]
		if a.TokensAboveCap != b.TokensAboveCap {
			return a.TokensAboveCap > b.TokensAboveCap
		}
		return a.Principal < b.Principal
	})
	return res
}

// suggest picks a cap for a population of principal-days and says why.
// Many principals: the smallest cap limiting at most the target share of
// principal-days (SuggestCap). A shared bucket, few principals or too few
// principal-days for the share to allow any: the peak times the headroom,
// never the peak itself.
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
		return suggestPeak(peak, fmt.Sprintf("%d principal-days, too few for a %s share to allow any above the cap", n, pct(o.TargetLimitedShare)), o.Headroom)
	}
	above := 0
	for _, v := range values {
		if v > c {
			above++
		}
	}
	return c, fmt.Sprintf("smallest cap with at most %s of %d principal-days above it (%d above, %d principals)", pct(o.TargetLimitedShare), n, above, principals)
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

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// dayAcc accumulates principal-days.
type dayAcc struct {
	values     []uint64
	principals map[string]bool
	total      uint64
	over       int
	above      uint64
	would429   uint64
	denied     uint64
	// overNames are the principals over the cap that day.
	overNames map[string]bool
}

func (d *dayAcc) add(used, capv uint64) {
	if d.principals == nil {
		d.principals = map[string]bool{}
	}
	d.values = append(d.values, used)
	d.total += used
	// The service denies when the counter after adding is above the limit.
	if capv > 0 && used > capv {
		d.over++
		d.above += used - capv
	}
}

func (d *dayAcc) merge(o *dayAcc) {
	d.values = append(d.values, o.values...)
	d.total += o.total
	d.over += o.over
	d.above += o.above
	d.would429 += o.would429
	d.denied += o.denied
}

func (d *dayAcc) stats() Stats {
	v := append([]uint64(nil), d.values...)
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	s := Stats{
		PrincipalDays: len(v), Principals: len(d.principals), TotalTokens: d.total,
		OverCap: d.over, TokensAboveCap: d.above, Would429: d.would429, Denied: d.denied,
		P50: Percentile(v, 50), P95: Percentile(v, 95), P99: Percentile(v, 99),
	}
	if len(v) > 0 {
		s.Max = v[len(v)-1]
		s.LimitedShare = float64(d.over) / float64(len(v))
	}
	return s
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
// principal-days are above C (the service denies above the cap, not at it).
// values need not be sorted. 0 when there are none.
func SuggestCap(values []uint64, share float64) uint64 {
	n := len(values)
	if n == 0 {
		return 0
	}
	v := append([]uint64(nil), values...)
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	k := int(math.Floor(share*float64(n) + 1e-9)) // principal-days allowed above
	if k >= n {
		k = n - 1
	}
	return v[n-1-k]
}
