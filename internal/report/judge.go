package report

import (
	"fmt"
	"math"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
)

// judgement is what one cap is judged on: its windows and, for a week or
// month never measured in full, the projection of a measured part.
type judgement struct {
	windows []judgedWindow
	text    string
	proj    *Projection
	// factor scales usage to the full window (1 unless projected).
	factor float64
	// noData says why the cap cannot be judged (empty when it can).
	noData string
}

type judgedWindow struct {
	w       ledger.Window
	partial bool
}

// judge picks the windows of a cap of period per. has reports whether the
// cap has data in a window; since is when measurement started (the day
// after shadowSince, zero when unknown).
func (p plan) judge(per ledger.Period, o Options, has func(ledger.Window) bool, since time.Time) judgement {
	j := judgement{factor: 1}
	switch per {
	case ledger.PeriodDay:
		for _, d := range p.days {
			j.windows = append(j.windows, judgedWindow{w: d, partial: p.beforeShadow(d, since)})
		}
		if o.IncludeToday {
			j.windows = append(j.windows, judgedWindow{w: p.today, partial: true})
		}
		j.text = fmt.Sprintf("%d days %s..%s", len(p.days), p.days[0], p.days[len(p.days)-1])
	case ledger.PeriodHour:
		for _, h := range p.windows(per, p.start, p.end.Add(-time.Hour)) {
			j.windows = append(j.windows, judgedWindow{w: h, partial: p.beforeShadow(h, since)})
		}
		if o.IncludeToday {
			for _, h := range p.windows(per, p.end, p.now) {
				j.windows = append(j.windows, judgedWindow{w: h, partial: true})
			}
		}
		j.text = fmt.Sprintf("%d hours of %d days %s..%s", len(p.windows(per, p.start, p.end.Add(-time.Hour))), len(p.days), p.days[0], p.days[len(p.days)-1])
	default:
		return p.judgeLong(per, has, since)
	}
	if o.IncludeToday {
		j.text += " and today so far"
	}
	return j
}

// judgeLong judges a week or month cap on complete windows measured in full
// (those overlapping the report's days, else the newest), or else on a
// projection of the window with the longest measured part.
func (p plan) judgeLong(per ledger.Period, has func(ledger.Window) bool, since time.Time) judgement {
	j := judgement{factor: 1}
	var full, inRange []ledger.Window
	var newestComplete *ledger.Window
	for _, w := range p.windows(per, p.start.AddDate(0, -1, -7), p.now) {
		if w.End(p.loc).After(p.end) || !has(w) {
			continue
		}
		w := w
		newestComplete = &w
		if !since.IsZero() && w.Start(p.loc).Before(since) {
			continue
		}
		full = append(full, w)
		if w.End(p.loc).After(p.start) {
			inRange = append(inRange, w)
		}
	}
	if len(inRange) == 0 && len(full) > 0 {
		inRange = full[len(full)-1:]
	}
	if len(inRange) > 0 {
		for _, w := range inRange {
			j.windows = append(j.windows, judgedWindow{w: w})
		}
		j.text = fmt.Sprintf("%s %s", per, inRange[0])
		if n := len(inRange); n > 1 {
			j.text = fmt.Sprintf("%d %ss %s..%s", n, per, inRange[0], inRange[n-1])
		}
		return j
	}
	return p.project(per, has, since, newestComplete)
}

// project judges a week or month on the part of it measured so far: the
// running window, or the newest complete one measured only in part,
// whichever was measured longer.
func (p plan) project(per ledger.Period, has func(ledger.Window) bool, since time.Time, lastComplete *ledger.Window) judgement {
	j := judgement{factor: 1}
	cands := []ledger.Window{ledger.WindowAt(per, p.now, p.loc)}
	if lastComplete != nil {
		cands = append(cands, *lastComplete)
	}
	var best ledger.Window
	var from, to time.Time
	for _, w := range cands {
		if !has(w) {
			continue
		}
		f, t := w.Start(p.loc), w.End(p.loc)
		if !since.IsZero() && since.After(f) {
			f = since
		}
		if p.now.Before(t) {
			t = p.now
		}
		if t.Sub(f) > to.Sub(from) {
			best, from, to = w, f, t
		}
	}
	span := to.Sub(from)
	if span <= 0 {
		j.noData = fmt.Sprintf("no %s measured yet", per)
		return j
	}
	if span.Hours() < MinProjectionHours {
		j.noData = fmt.Sprintf("%s %s has only %.1f hours measured: too early to project it to a whole %s", per, best, span.Hours(), per)
		return j
	}
	length := best.End(p.loc).Sub(best.Start(p.loc))
	j.factor = float64(length) / float64(span)
	j.windows = []judgedWindow{{w: best, partial: true}}
	j.proj = &Projection{
		Window: best.String(), ObservedFrom: from.UTC().Format(time.RFC3339), ObservedTo: to.UTC().Format(time.RFC3339),
		ObservedHours: math.Round(span.Hours()*10) / 10, Factor: math.Round(j.factor*1000) / 1000,
	}
	j.text = fmt.Sprintf("%s %s: a projection from %.1f of %.0f days measured (x%.2f); no %s measured in full yet",
		per, best, span.Hours()/24, length.Hours()/24, j.factor, per)
	return j
}

// beforeShadow reports whether window w starts before since, the first full
// day of shadow (zero: unknown, never). Such a window (shadowSince's day:
// shadowing started during it) is not a full shadow window: like today, it
// counts in the sums but neither as covered nor in the share a verdict
// weighs, as promote --evidence judges it (internal/promote, capRefusals:
// shadow days from shadowSince+1).
func (p plan) beforeShadow(w ledger.Window, since time.Time) bool {
	return !since.IsZero() && w.Start(p.loc).Before(since)
}

// measuredSince is the first instant of the first full day of shadow
// (shadowSince is partial: shadowing started during it), zero when unknown.
func measuredSince(shadowSince string, loc *time.Location) time.Time {
	d, err := time.ParseInLocation(DateLayout, shadowSince, loc)
	if err != nil {
		return time.Time{}
	}
	return d.AddDate(0, 0, 1)
}
