package report

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
)

// Defaults of Options.
const (
	DefaultDays               = 7
	MaxDays                   = ledger.MaxRetentionDays
	DefaultTargetLimitedShare = 0.01
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
	// Group budgets have one bucket: their principal is the group.
	Group bool
	// Currency is set for a money budget: caps and usage count 1/10,000 of it.
	Currency string
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
	return nil
}

// unmappedName names a rule with no budget in the mapping.
func unmappedName(r ledger.RuleID) string { return "rule " + r.Rule }

// Build computes the report from ledger data (any order; days outside the
// window are ignored).
func Build(data []ledger.DayData, m Mapping, o Options) (*Report, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	window := Window(o.Now, o.Days)
	index := map[ledger.Day]int{}
	for i, d := range window {
		index[d] = i
	}
	r := &Report{
		Version: FormatVersion, GeneratedAt: o.Now.UTC(), Days: o.Days,
		From: window[0].String(), To: window[len(window)-1].String(), TargetLimitedShare: o.TargetLimitedShare,
	}
	type acc struct {
		b        Budget
		days     []dayAcc
		seen     map[string]bool
		rules    map[string]bool
		all      []uint64
		defaults []uint64 // principal-days under the default cap
	}
	budgets := map[string]*acc{}
	get := func(name string) *acc {
		a := budgets[name]
		if a == nil {
			a = &acc{b: Budget{Name: name}, days: make([]dayAcc, len(window)), seen: map[string]bool{}, rules: map[string]bool{}}
			if bi, ok := m.Budgets[name]; ok {
				a.b.Mode, a.b.Cap, a.b.Overrides, a.b.Currency = bi.Mode, bi.Cap, bi.Overrides, bi.Currency
			}
			budgets[name] = a
		}
		return a
	}
	// Budgets of the spec appear even without data, so a missing week shows.
	for name := range m.Budgets {
		get(name)
	}
	unmapped := map[string]bool{}
	for _, dd := range data {
		i, ok := index[dd.Day]
		if !ok {
			continue
		}
		info, mapped := m.Rules[dd.Rule]
		if !mapped {
			info = RuleInfo{Budget: unmappedName(dd.Rule), Kind: KindTokens}
			if len(m.Rules) > 0 {
				unmapped[fmt.Sprintf("rule %s (domain %s) has measurements but no budget in the spec: stale policy or another spec", dd.Rule.Rule, dd.Rule.Domain)] = true
			}
		}
		if info.Kind == KindKillSwitch {
			continue // request counts, not tokens
		}
		a := get(info.Budget)
		bi := m.Budgets[info.Budget]
		a.rules[dd.Rule.Rule] = true
		day := &a.days[i]
		day.would429 += dd.ShadowDenials
		day.denied += dd.EnforceDenials
		for field, used := range dd.Usage {
			name := ledger.PrincipalName(field)
			capv := info.Cap
			isDefault := true
			switch {
			case info.Principal != "":
				name = info.Principal
				isDefault = false
				if c, ok := bi.Overrides[name]; ok && capv == 0 {
					capv = c
				}
			case bi.Group || field == "":
				if name == "" {
					name = "(group " + info.Budget + ")"
				}
			}
			if capv == 0 {
				if c, ok := bi.Overrides[name]; ok {
					capv, isDefault = c, false
				} else {
					capv = bi.Cap
				}
			}
			day.add(used, capv)
			a.seen[name] = true
			day.principals[name] = true
			a.all = append(a.all, used)
			if isDefault {
				a.defaults = append(a.defaults, used)
			}
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
	for _, name := range sortedNames(budgets) {
		a := budgets[name]
		var sum dayAcc
		sum.principals = a.seen
		for i, d := range window {
			ds := a.days[i].stats()
			a.b.PerDay = append(a.b.PerDay, DayStats{Date: d.String(), Stats: ds})
			if ds.PrincipalDays > 0 || ds.Would429 > 0 || ds.Denied > 0 {
				a.b.DaysCovered++
			}
			sum.merge(&a.days[i])
		}
		a.b.Summary = sum.stats()
		a.b.Rules = sortedNames(a.rules)
		sort.Slice(a.all, func(i, j int) bool { return a.all[i] < a.all[j] })
		a.b.Distribution = a.all
		a.b.SuggestedCap = SuggestCap(a.defaults, o.TargetLimitedShare)
		if a.b.DaysCovered < o.Days {
			r.Warnings = append(r.Warnings, fmt.Sprintf("budget %s: measurements on %d of %d days (%s..%s); a promotion needs 7 full days", name, a.b.DaysCovered, o.Days, r.From, r.To))
		}
		r.Budgets = append(r.Budgets, a.b)
	}
	for w := range unmapped {
		r.Warnings = append(r.Warnings, w)
	}
	sort.Strings(r.Warnings)
	return r, nil
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
