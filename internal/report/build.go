package report

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// capRow is one ledger rule-window of a cap, with what its rule counts.
type capRow struct {
	d    *ledger.Data
	info RuleInfo
}

// budgetAcc gathers one budget's rows by cap.
type budgetAcc struct {
	name      string
	info      BudgetInfo
	caps      map[CapKey][]capRow
	rules     map[string]bool
	todayData bool // data today, outside every judged window
}

// grouped is the ledger data sorted into budgets.
type grouped struct {
	budgets  map[string]*budgetAcc
	warnings map[string]bool
}

// Build computes the report from ledger data (any order; windows no cap is
// judged on are ignored).
func Build(data []ledger.Data, m Mapping, o Options) (*Report, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	p := newPlan(o)
	r := &Report{
		Version: FormatVersion, GeneratedAt: o.Now.UTC(), TimeZone: p.loc.String(), Days: o.Days,
		From: p.days[0].String(), To: p.days[len(p.days)-1].String(), TargetLimitedShare: o.TargetLimitedShare,
		MaxLimitedShare: o.MaxLimitedShare, RequiredDays: o.RequiredDays, Headroom: o.Headroom, TopN: o.TopN,
	}
	if o.IncludeToday {
		r.PartialDay = p.today.String()
	}
	g := groupData(data, m, p)
	if err := g.only(o.Only); err != nil {
		return nil, err
	}
	anyData, anyToday := false, false
	for _, name := range sortedNames(g.budgets) {
		a := g.budgets[name]
		b := buildBudget(a, p, o, r)
		for _, c := range b.Caps {
			anyData = anyData || c.Summary.PrincipalWindows > 0 || c.WindowsCovered > 0 || slices.ContainsFunc(c.Overridden, func(ov Override) bool { return ov.Summary.PrincipalWindows > 0 })
			r.Summary = append(r.Summary, summaryRow(b, c))
			if c.Window == ledger.PeriodDay.String() && c.DaysCovered < o.Days {
				g.warnings[fmt.Sprintf("budget %s: day cap measured on %d of %d days (%s..%s); a promotion needs %d full days", name, c.DaysCovered, o.Days, r.From, r.To, o.RequiredDays)] = true
			}
		}
		anyToday = anyToday || a.todayData
		r.Budgets = append(r.Budgets, b)
	}
	if !anyData {
		r.NoData = noDataWhy(r, o, anyToday)
	}
	r.Warnings = sortedNames(g.warnings)
	return r, nil
}

// groupData sorts ledger rows into budgets and caps. Budgets of the mapping
// appear even without data, so a missing week shows.
func groupData(data []ledger.Data, m Mapping, p plan) *grouped {
	g := &grouped{budgets: map[string]*budgetAcc{}, warnings: map[string]bool{}}
	for name, bi := range m.Budgets {
		g.get(name, bi)
	}
	for i := range data {
		d := &data[i]
		info, mapped := m.Rule(d.Rule)
		if info.Kind == budgetmap.KindKillSwitch {
			continue // request counts, not tokens
		}
		if !mapped && len(m.Rules) > 0 {
			g.warnings[fmt.Sprintf("rule %s (domain %s) has measurements but no budget in the spec: stale policy or another spec", d.Rule.Rule, d.Rule.Domain)] = true
		}
		a := g.get(info.Budget, m.Budgets[info.Budget])
		a.rules[d.Rule.Rule] = true
		k := CapKey{Period: d.Window.Period, Measure: info.Measure}
		a.caps[k] = append(a.caps[k], capRow{d: d, info: info})
		if !d.Window.Start(p.loc).Before(p.end) && !d.Empty() {
			a.todayData = true
		}
	}
	return g
}

func (g *grouped) get(name string, bi BudgetInfo) *budgetAcc {
	a := g.budgets[name]
	if a == nil {
		a = &budgetAcc{name: name, info: bi, caps: map[CapKey][]capRow{}, rules: map[string]bool{}}
		g.budgets[name] = a
	}
	return a
}

// only keeps the named budgets; an unknown name is an error listing the known.
func (g *grouped) only(names []string) error {
	if len(names) == 0 {
		return nil
	}
	keep := map[string]*budgetAcc{}
	for _, name := range names {
		a, ok := g.budgets[name]
		if !ok {
			return fmt.Errorf("%w %q (known: %v)", ErrUnknownBudget, name, sortedNames(g.budgets))
		}
		keep[name] = a
	}
	g.budgets = keep
	return nil
}

// buildBudget judges each cap of a budget and draws its days.
func buildBudget(a *budgetAcc, p plan, o Options, r *Report) Budget {
	b := Budget{Name: a.name, Mode: a.info.Mode, ShadowSince: a.info.ShadowSince, Shared: a.info.Group, Reserve: a.info.Reserve, Rules: sortedNames(a.rules)}
	for _, k := range capKeys(a) {
		c := buildCap(a, k, p, o)
		c.Verdict = capVerdict(&c, b.Mode, o)
		b.Caps = append(b.Caps, c)
	}
	b.Daily = daily(a, p, o)
	b.Verdict = budgetVerdict(&b)
	if len(b.Caps) == 0 {
		b.NoData = noDataWhy(r, o, a.todayData)
	}
	return b
}

// capKeys are a budget's caps, from the spec and the data: shortest window
// first, tokens before money.
func capKeys(a *budgetAcc) []CapKey {
	seen := map[CapKey]bool{}
	for k := range a.info.Caps {
		seen[k] = true
	}
	for _, caps := range a.info.Overrides {
		for k := range caps {
			seen[k] = true
		}
	}
	for k := range a.caps {
		seen[k] = true
	}
	keys := make([]CapKey, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Period != keys[j].Period {
			return keys[i].Period < keys[j].Period
		}
		return keys[i].Measure > keys[j].Measure // tokens before cost
	})
	return keys
}

// buildCap judges one cap on its windows.
func buildCap(a *budgetAcc, k CapKey, p plan, o Options) Cap {
	ci := a.info.Caps[k]
	c := Cap{Window: k.Period.String(), Measure: k.Measure, Currency: ci.Currency, Cap: ci.Cap}
	if c.Measure == MeasureCost && c.Currency == "" {
		c.Currency = overrideCurrency(a.info, k)
	}
	rows := a.caps[k]
	has := func(w ledger.Window) bool {
		return slices.ContainsFunc(rows, func(r capRow) bool { return r.d.Window == w && !r.d.Empty() })
	}
	j := p.judge(k.Period, o, has, measuredSince(a.info.ShadowSince, p.loc))
	c.Judged = Judged{Text: j.text, Projection: j.proj}
	for _, jw := range j.windows {
		c.Judged.Windows = append(c.Judged.Windows, jw.w.String())
	}
	if n := len(j.windows); n > 0 {
		c.Judged.From = j.windows[0].w.Start(p.loc).UTC().Format(time.RFC3339)
		c.Judged.To = j.windows[n-1].w.End(p.loc).UTC().Format(time.RFC3339)
	}
	if j.noData != "" {
		c.NoData = j.noData
		return c
	}
	f := newFill(a, k, j)
	for _, row := range rows {
		f.row(row)
	}
	f.finish(&c, p, o)
	return c
}

func overrideCurrency(bi BudgetInfo, k CapKey) string {
	for _, caps := range bi.Overrides {
		if ci, ok := caps[k]; ok && ci.Currency != "" {
			return ci.Currency
		}
	}
	return ""
}

// fill puts one cap's rows into its populations: the default rule's
// principals and each override principal.
type fill struct {
	a         *budgetAcc
	k         CapKey
	j         judgement
	index     map[ledger.Window]int
	def       *population
	overrides map[string]*population
}

func newFill(a *budgetAcc, k CapKey, j judgement) *fill {
	f := &fill{a: a, k: k, j: j, index: map[ledger.Window]int{}, def: newPopulation(j.windows), overrides: map[string]*population{}}
	for i, jw := range j.windows {
		f.index[jw.w] = i
	}
	for name, caps := range a.info.Overrides {
		if _, ok := caps[k]; ok {
			f.override(name)
		}
	}
	return f
}

func (f *fill) override(name string) *population {
	if f.overrides[name] == nil {
		f.overrides[name] = newPopulation(f.j.windows)
	}
	return f.overrides[name]
}

// of is the population a principal of a row belongs to, and its cap.
func (f *fill) of(info RuleInfo, name string) (*population, uint64, string) {
	if info.Principal != "" {
		name = info.Principal
	}
	if caps, ok := f.a.info.Overrides[name]; ok {
		return f.override(name), caps[f.k].Cap, name
	}
	return f.def, f.a.info.Caps[f.k].Cap, name
}

// name is a principal's display name in this budget.
func (f *fill) name(field string) string {
	name := ledger.PrincipalName(field)
	if name == "" && (f.a.info.Group || field == "") {
		return "(group " + f.a.name + ")"
	}
	return name
}

func (f *fill) row(row capRow) {
	i, ok := f.index[row.d.Window]
	if !ok {
		return
	}
	scale := max(row.info.Scale, 1)
	for field, used := range row.d.Usage {
		pop, capv, name := f.of(row.info, f.name(field))
		pop.add(i, name, project(used*scale, f.j.factor), capv)
	}
	// Each principal's denials go to its population; what the rule counted
	// beyond them belongs to the population the rule counts.
	rest := row.d.Denials
	byPop := map[*population]map[string]ledger.Denials{}
	for field, d := range row.d.PrincipalDenials {
		pop, _, name := f.of(row.info, f.name(field))
		if byPop[pop] == nil {
			byPop[pop] = map[string]ledger.Denials{}
		}
		cur := byPop[pop][name]
		cur.Add(d)
		byPop[pop][name] = cur
		rest.Shadow, rest.Enforce, rest.Reserve = sub(rest.Shadow, d.Shadow), sub(rest.Enforce, d.Enforce), sub(rest.Reserve, d.Reserve)
	}
	// The population the rule counts: an override's own, or the default
	// one, also for the unidentified requests' rule (principal
	// budgetgen/no-claim, no override: one more principal of the budget).
	own, _, ownName := f.of(row.info, "")
	if row.info.Principal != "" && rest != (ledger.Denials{}) {
		// A rule counting one principal denied only that principal, though
		// its descriptor carried no principal value to record.
		if byPop[own] == nil {
			byPop[own] = map[string]ledger.Denials{}
		}
		cur := byPop[own][ownName]
		cur.Add(rest)
		byPop[own][ownName], rest = cur, ledger.Denials{}
	}
	// Reservations are the rule's totals: the population the rule counts.
	h := row.d.Holds
	own.hold(i, ledger.Holds{Count: h.Count, Held: h.Held * scale, Expired: h.Expired * scale})
	ident := func(s string) string { return s }
	for pop, per := range byPop {
		var total ledger.Denials
		for _, d := range per {
			total.Add(d)
		}
		if pop == own {
			total.Add(rest)
		}
		pop.deny(i, total, per, ident)
	}
	if byPop[own] == nil {
		own.deny(i, rest, nil, ident)
	}
}

func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// project scales a measured usage to the whole window, rounding up.
func project(v uint64, factor float64) uint64 {
	if factor == 1 {
		return v
	}
	return uint64(math.Ceil(float64(v) * factor))
}

// finish computes the cap's numbers from its populations.
func (f *fill) finish(c *Cap, p plan, o Options) {
	pr := f.def.finish(c.Cap, p)
	c.PerWindow, c.Summary, c.WindowsCovered, c.DaysCovered = pr.perWindow, pr.summary, pr.covered, pr.daysCovered
	c.Distribution, c.PrincipalPeaks = pr.distribution, pr.peaks
	c.OverCapPrincipals, c.OverCapPrincipalsTotal = pr.over, len(pr.over)
	if len(c.OverCapPrincipals) > o.TopN {
		c.OverCapPrincipals = c.OverCapPrincipals[:o.TopN]
	}
	c.Outliers, c.OutliersTotal = pr.outliers[:min(len(pr.outliers), o.TopN)], len(pr.outliers)
	if c.Window == ledger.PeriodHour.String() {
		c.PerDay = rollUpDays(f.def, p)
	}
	if c.Summary.PrincipalWindows > 0 {
		c.SuggestedCap, c.SuggestionBasis = suggest(append(pr.distribution, outlierValues(pr.outliers)...), c.Summary.Principals, f.a.info.Group, o)
	} else {
		c.NoData = noMeasurements(c, f.a.todayData, o)
	}
	for _, name := range sortedNames(f.overrides) {
		op := f.overrides[name].finish(0, p)
		ov := Override{Principal: name, Cap: f.a.info.Overrides[name][f.k].Cap, WindowsCovered: op.covered, DaysCovered: op.daysCovered, Summary: op.summary, PerWindow: op.perWindow}
		if ov.Summary.PrincipalWindows > 0 {
			ov.SuggestedCap, ov.SuggestionBasis = suggestPeak(op.summary.Max, "one principal with its own cap (override)", o.Headroom)
		} else {
			ov.NoData = noMeasurements(c, f.a.todayData, o)
		}
		c.WindowsCovered, c.DaysCovered = max(c.WindowsCovered, op.covered), max(c.DaysCovered, op.daysCovered)
		c.Overridden = append(c.Overridden, ov)
	}
}

func outlierValues(os []Outlier) []uint64 {
	out := make([]uint64, len(os))
	for i, o := range os {
		out[i] = o.Value
	}
	return out
}

// rollUpDays sums an hour cap's windows per day, for tables: principal-hours,
// the largest hour, hours over the cap, denials.
func rollUpDays(pop *population, p plan) []WindowStats {
	var out []WindowStats
	var seen []map[string]bool
	index := map[ledger.Day]int{}
	for i, jw := range pop.windows {
		d := ledger.WindowAt(ledger.PeriodDay, jw.w.Start(p.loc), p.loc)
		k, ok := index[d.Day]
		if !ok {
			k = len(out)
			index[d.Day] = k
			out = append(out, WindowStats{Window: d.String()})
			seen = append(seen, map[string]bool{})
		}
		s := pop.acc[i].stats()
		ws := &out[k]
		ws.Partial = ws.Partial || jw.partial
		ws.PrincipalWindows += s.PrincipalWindows
		ws.Max = max(ws.Max, s.Max)
		ws.Total += s.Total
		ws.OverCap += s.OverCap
		ws.AboveCap += s.AboveCap
		ws.Would429 += s.Would429
		ws.Denied += s.Denied
		ws.ReserveDenied += s.ReserveDenied
		ws.Holds += s.Holds
		ws.Held += s.Held
		ws.Expired += s.Expired
		for n := range pop.acc[i].principals {
			seen[k][n] = true
		}
		ws.Principals = len(seen[k])
	}
	for i := range out {
		if out[i].PrincipalWindows > 0 {
			out[i].LimitedShare = float64(out[i].OverCap) / float64(out[i].PrincipalWindows)
		}
	}
	return out
}

// noMeasurements says why a judged cap has no principal-windows.
func noMeasurements(c *Cap, todayData bool, o Options) string {
	switch {
	case o.IncludeToday:
		return "no measurements in " + c.Judged.Text
	case todayData:
		return "no measurements in " + c.Judged.Text + ": the report ends yesterday; today's traffic is not in it, use --include-today"
	}
	return "no measurements in " + c.Judged.Text
}

// noDataWhy says why a report (or a budget) has no measurements at all.
func noDataWhy(r *Report, o Options, todayData bool) string {
	switch {
	case o.IncludeToday:
		return fmt.Sprintf("no measurements in %s..%s nor today so far", r.From, r.PartialDay)
	case todayData:
		return fmt.Sprintf("no measurements in %s..%s: the window ends yesterday; today's traffic is not in it, use --include-today", r.From, r.To)
	}
	return fmt.Sprintf("no measurements in %s..%s (the window ends yesterday; today has none either)", r.From, r.To)
}

// summaryRow is a cap's line in the summary table.
func summaryRow(b Budget, c Cap) SummaryRow {
	over := c.OverCapPrincipalsTotal
	would := c.Summary.Would429
	for _, ov := range c.Overridden {
		if ov.Summary.OverCap > 0 {
			over++
		}
		would += ov.Summary.Would429
	}
	return SummaryRow{
		Budget: b.Name, Window: c.Window, Measure: c.Measure, Currency: c.Currency, Cap: c.Cap, Mode: b.Mode,
		Judged: c.Judged.Text, Projection: c.Judged.Projection != nil, PrincipalsOver: over, Would429: would,
		SuggestedCap: c.SuggestedCap, Verdict: c.Verdict,
	}
}

// capLabel names a cap for people: "tokens per day", "USD per month".
func capLabel(window, measure, currency string) string {
	unit := "tokens"
	if measure == MeasureCost {
		unit = strings.TrimSpace(currency + " money")
		if currency != "" {
			unit = currency
		}
	}
	return unit + " per " + window
}
