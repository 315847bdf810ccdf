package report

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
)

// Defaults of Options.
const (
	DefaultDays               = 7
	MaxDays                   = ledger.MaxRetentionDays
	DefaultTargetLimitedShare = 0.01
	// DefaultMaxLimitedShare is the share of principal-windows over a cap
	// under which the cap is ready to promote (promote's default too).
	DefaultMaxLimitedShare = 0.01
	// DefaultRequiredDays is how many full days of measurement a promotion
	// needs (promote's shadow rule).
	DefaultRequiredDays = 7
	// DefaultHeadroom multiplies an observed peak when a suggestion is based
	// on it: a cap exactly at last week's peak denies the next busier day.
	DefaultHeadroom = 1.2
	MaxHeadroom     = 10
	// DefaultTopN is how many over-cap principals and outliers a cap lists.
	DefaultTopN = 10
	// MinPrincipalsForPercentile: with fewer distinct principals a
	// percentile says little, so the suggestion is the peak times Headroom.
	MinPrincipalsForPercentile = 20
	// OutlierFactor: a principal-window more than this many times the 95th
	// percentile (the median with fewer than 20 values), and over the cap,
	// is an outlier, shown apart from the histogram.
	OutlierFactor = 10
	// MinProjectionHours is the least measured part of a week or month a
	// projection is made from.
	MinProjectionHours = 24
)

// Options for Build. The zero value reports the 7 days before Now's day in
// UTC with a 1% target; Now is required.
type Options struct {
	Now  time.Time
	Days int // completed days; default DefaultDays
	// Location is the zone of the day, week and month windows: the service's
	// RESET_TIME_ZONE. Default UTC.
	Location           *time.Location
	TargetLimitedShare float64 // default DefaultTargetLimitedShare
	// MaxLimitedShare: a cap is ready to promote with a share of
	// principal-windows over it strictly under this; default
	// DefaultMaxLimitedShare.
	MaxLimitedShare float64
	// RequiredDays of measurement a promotion needs; default DefaultRequiredDays.
	RequiredDays int
	// IncludeToday adds Now's day so far after the completed days (and this
	// hour's partial window to hour caps), marked partial everywhere.
	IncludeToday bool
	// Headroom multiplies a peak-based suggestion; default DefaultHeadroom,
	// must be within (1, MaxHeadroom].
	Headroom float64
	// TopN bounds the over-cap principals and outliers listed per cap;
	// default DefaultTopN.
	TopN int
	// Only restricts the report to these budgets; an unknown name is an error.
	Only []string
}

// ErrUnknownBudget is wrapped when Options.Only names a budget that neither
// the mapping nor the ledger knows.
var ErrUnknownBudget = errors.New("unknown budget")

func (o *Options) validate() error {
	if o.Now.IsZero() {
		return errors.New("report: no clock")
	}
	if o.Location == nil {
		o.Location = time.UTC
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
	if o.MaxLimitedShare == 0 {
		o.MaxLimitedShare = DefaultMaxLimitedShare
	}
	for _, s := range []float64{o.TargetLimitedShare, o.MaxLimitedShare} {
		if s <= 0 || s >= 1 || math.IsNaN(s) {
			return fmt.Errorf("share %v: must be within (0, 1)", s)
		}
	}
	if o.RequiredDays == 0 {
		o.RequiredDays = DefaultRequiredDays
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
	if o.TopN < 1 || o.RequiredDays < 1 {
		return fmt.Errorf("--top %d: must be at least 1", o.TopN)
	}
	return nil
}

// plan is where a report at Now looks: its days and, per period, the
// windows to read.
type plan struct {
	loc *time.Location
	now time.Time
	// days are the completed days, oldest first; today is Now's day.
	days  []ledger.Window
	today ledger.Window
	// start and end bound the completed days: [first day's start, today's start).
	start, end time.Time
}

func newPlan(o Options) plan {
	loc := o.Location
	if loc == nil {
		loc = time.UTC
	}
	p := plan{loc: loc, now: o.Now, today: ledger.WindowAt(ledger.PeriodDay, o.Now, loc)}
	for i := o.Days; i >= 1; i-- {
		p.days = append(p.days, ledger.DayWindow(p.today.Day-ledger.Day(i)))
	}
	p.start, p.end = p.days[0].Start(loc), p.today.Start(loc)
	return p
}

// windows lists the windows of period per from the one holding from to the
// one holding to, oldest first.
func (p plan) windows(per ledger.Period, from, to time.Time) []ledger.Window {
	var out []ledger.Window
	last := ledger.WindowAt(per, to, p.loc)
	for w := ledger.WindowAt(per, from, p.loc); ; w = w.Next(p.loc) {
		out = append(out, w)
		if w == last || len(out) > 100_000 {
			return out
		}
	}
}

// read lists every window a report needs: the days and their hours through
// now, and the weeks and months from the one before the report's first day
// through now (the last complete month may end before the first day).
func (p plan) read() []ledger.Window {
	out := p.windows(ledger.PeriodDay, p.start, p.now)
	out = append(out, p.windows(ledger.PeriodHour, p.start, p.now)...)
	out = append(out, p.windows(ledger.PeriodWeek, p.start.AddDate(0, 0, -7), p.now)...)
	prevMonth := ledger.WindowAt(ledger.PeriodMonth, p.now, p.loc).Start(p.loc).AddDate(0, -1, 0)
	if p.start.Before(prevMonth) {
		prevMonth = p.start
	}
	return append(out, p.windows(ledger.PeriodMonth, prevMonth, p.now)...)
}

// ReadWindows are the windows to read from the ledger for a report with
// options o: every window any cap may be judged on, and today's (read even
// without IncludeToday, so an empty report can say whether today has data).
func ReadWindows(o Options) ([]ledger.Window, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	return newPlan(o).read(), nil
}
