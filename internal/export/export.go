// Package export turns the ledger into chargeback files: one row per
// principal, budget and charge period (a day or a month), with the tokens
// consumed and, for budgets with a money cap (priced by the spec's price
// table as Envoy AI Gateway computes it), the cost. Two formats: a FinOps
// FOCUS 1.2 cost-and-usage CSV (github.com/FinOps-Open-Cost-and-Usage-Spec/
// FOCUS_Spec, specification/columns), and a plain CSV.
package export

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/report"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// Charge period lengths.
const (
	PeriodDay   = "day"
	PeriodMonth = "month"
)

// Options for Build. From, To and Period are required.
type Options struct {
	// From and To bound the charge periods: windows starting in [From, To).
	From, To time.Time
	// Period is PeriodDay or PeriodMonth.
	Period string
	// Location is the zone of the service's windows (RESET_TIME_ZONE);
	// default UTC. Every exported time is in UTC, as FOCUS requires.
	Location *time.Location
	// BudgetSet names the billing account when the ledger's rules do not
	// (a service without a budget map); default "budgetgen".
	BudgetSet string
	// Currency of costs (spec.pricing.currency); default USD.
	Currency string
}

// Row is one principal's use of one budget in one charge period.
type Row struct {
	Start, End time.Time // the charge period, UTC
	// BillingStart and BillingEnd are the billing period: the calendar
	// month (in the service's zone) the charge period starts in, UTC.
	BillingStart, BillingEnd time.Time
	BudgetSet, Budget        string
	Principal                string // as people read it (ledger.PrincipalName)
	// Tokens consumed (HasTokens false when the budget has no token cap
	// measured in this period); Cost in 1/10,000 of Currency (HasCost false
	// when it has no money cap).
	Tokens, Cost       uint64
	HasTokens, HasCost bool
	Currency           string
	Denials            ledger.Denials
}

// ErrOptions is wrapped by invalid options.
var ErrOptions = errors.New("export options")

func (o *Options) validate() error {
	if o.Period != PeriodDay && o.Period != PeriodMonth {
		return fmt.Errorf("%w: period %q: want day or month", ErrOptions, o.Period)
	}
	if !o.From.Before(o.To) {
		return fmt.Errorf("%w: from %s is not before to %s", ErrOptions, o.From.Format(time.DateOnly), o.To.Format(time.DateOnly))
	}
	if o.Location == nil {
		o.Location = time.UTC
	}
	if o.BudgetSet == "" {
		o.BudgetSet = "budgetgen"
	}
	if o.Currency == "" {
		o.Currency = "USD"
	}
	return nil
}

// Windows are the ledger windows an export with o reads: every hour, day,
// week and month starting in [From, To).
func Windows(o Options) ([]ledger.Window, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	var out []ledger.Window
	for _, p := range ledger.Periods {
		for w := ledger.WindowAt(p, o.From, o.Location); w.Start(o.Location).Before(o.To); w = w.Next(o.Location) {
			if !w.Start(o.Location).Before(o.From) {
				out = append(out, w)
			}
			if len(out) > 1_000_000 {
				return nil, fmt.Errorf("%w: %s..%s holds too many windows", ErrOptions, o.From, o.To)
			}
		}
	}
	return out, nil
}

// key groups a principal's usage of a budget in one charge period.
type key struct {
	budget, principal string
	start             int64
}

// Build aggregates ledger data into rows, sorted by period, budget and
// principal. Each budget's tokens come from one window length only (its
// rules count the same tokens in every window they have): the charge
// period's own, else the shortest that tiles it (hours for a day; days, then
// hours, for a month); a budget with only longer windows (a week, or a month
// in a day export) is charged per window of its own.
func Build(data []ledger.Data, m report.Mapping, o Options) ([]Row, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	type src struct{ budget, measure string }
	byBudget := map[src][]*ledger.Data{}
	infos := map[src]report.RuleInfo{}
	for i := range data {
		d := &data[i]
		info, _ := m.Rule(d.Rule)
		if info.Kind == budgetmap.KindKillSwitch {
			continue
		}
		s := src{info.Budget, info.Measure}
		byBudget[s] = append(byBudget[s], d)
		infos[s] = info
	}
	rows := map[key]*Row{}
	for s, ds := range byBudget {
		per := sourcePeriod(ds, o.Period)
		for _, d := range ds {
			if d.Window.Period != per {
				continue
			}
			addWindow(rows, d, infos[s], per, o)
		}
	}
	return sortRows(rows), nil
}

// sourcePeriod picks the window length a budget's rows are read from.
func sourcePeriod(ds []*ledger.Data, charge string) ledger.Period {
	have := map[ledger.Period]bool{}
	for _, d := range ds {
		have[d.Window.Period] = true
	}
	prefs := []ledger.Period{ledger.PeriodDay, ledger.PeriodHour, ledger.PeriodWeek, ledger.PeriodMonth}
	if charge == PeriodMonth {
		prefs = []ledger.Period{ledger.PeriodMonth, ledger.PeriodDay, ledger.PeriodHour, ledger.PeriodWeek}
	}
	for _, p := range prefs {
		if have[p] {
			return p
		}
	}
	return 0
}

// addWindow adds one rule-window to the rows of its charge period.
func addWindow(rows map[key]*Row, d *ledger.Data, info report.RuleInfo, per ledger.Period, o Options) {
	start, end := chargePeriod(d.Window, per, o)
	if start.Before(o.From) || !start.Before(o.To) {
		return
	}
	set, budget := o.BudgetSet, info.Budget
	if d.Rule.Domain == ledger.BudgetDomain {
		if s := report.BucketSet(d.Rule.Rule); s != "" {
			set = s
		}
	}
	row := func(field string) *Row {
		name := ledger.PrincipalName(field)
		k := key{budget, name, start.Unix()}
		r := rows[k]
		if r == nil {
			bill := ledger.WindowAt(ledger.PeriodMonth, start, o.Location)
			r = &Row{Start: start.UTC(), End: end.UTC(), BillingStart: bill.Start(o.Location).UTC(), BillingEnd: bill.End(o.Location).UTC(),
				BudgetSet: set, Budget: budget, Principal: name, Currency: o.Currency}
			rows[k] = r
		}
		return r
	}
	scale := max(info.Scale, 1)
	for field, used := range d.Usage {
		r := row(field)
		if info.Measure == report.MeasureCost {
			r.Cost, r.HasCost = r.Cost+used, true
		} else {
			r.Tokens, r.HasTokens = r.Tokens+used*scale, true
		}
	}
	for field, den := range d.PrincipalDenials {
		row(field).Denials.Add(den)
	}
}

// chargePeriod is the charge period a window counts in: the day or month
// holding it, or the window itself when it is longer than that.
func chargePeriod(w ledger.Window, per ledger.Period, o Options) (time.Time, time.Time) {
	p := ledger.PeriodDay
	if o.Period == PeriodMonth {
		p = ledger.PeriodMonth
	}
	if per > p {
		return w.Start(o.Location), w.End(o.Location)
	}
	c := ledger.WindowAt(p, w.Start(o.Location), o.Location)
	return c.Start(o.Location), c.End(o.Location)
}

func sortRows(rows map[key]*Row) []Row {
	out := make([]Row, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		switch {
		case !a.Start.Equal(b.Start):
			return a.Start.Before(b.Start)
		case a.Budget != b.Budget:
			return a.Budget < b.Budget
		}
		return a.Principal < b.Principal
	})
	return out
}
