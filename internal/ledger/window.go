package ledger

import (
	"fmt"
	"strconv"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
)

// Period is the length of a ledger window: the unit of the rule whose usage
// it holds.
type Period uint8

// Periods the ledger measures, shortest first.
const (
	PeriodHour Period = iota + 1
	PeriodDay
	PeriodWeek
	PeriodMonth
)

// Periods lists the periods, shortest first.
var Periods = []Period{PeriodHour, PeriodDay, PeriodWeek, PeriodMonth}

var periodNames = [...]string{"", "hour", "day", "week", "month"}

// String is the period's name: hour, day, week or month.
func (p Period) String() string {
	if int(p) < len(periodNames) && p != 0 {
		return periodNames[p]
	}
	return "period(" + strconv.Itoa(int(p)) + ")"
}

// ParsePeriod reads a period name.
func ParsePeriod(s string) (Period, bool) {
	for i, n := range periodNames {
		if i > 0 && n == s {
			return Period(i), true
		}
	}
	return 0, false
}

// Window is one counter window of the ledger. It is named by its start as a
// civil date: for day, week and month windows the local date in the ledger's
// zone (the service's RESET_TIME_ZONE: a day from local midnight, an ISO week
// from Monday, a month from the 1st), for hour windows the UTC date and hour
// (hours are epoch-aligned in every zone, docs/windows.md). The zero Window is
// invalid.
type Window struct {
	Period Period
	// Day is the date of the window's start.
	Day Day
	// Hour is the UTC hour (0-23) an hour window starts at; 0 otherwise.
	Hour uint8
}

// DayWindow is the day window of date d.
func DayWindow(d Day) Window { return Window{Period: PeriodDay, Day: d} }

// WindowAt returns the calendar window of period p holding t, in loc (UTC
// when nil).
func WindowAt(p Period, t time.Time, loc *time.Location) Window {
	if loc == nil {
		loc = time.UTC
	}
	switch p {
	case PeriodHour:
		u := t.UTC()
		return Window{Period: p, Day: DayOf(u), Hour: uint8(u.Hour())}
	case PeriodWeek:
		d := DayIn(t, loc)
		// 1970-01-01 was a Thursday: Monday is day 4 of its week, so
		// (d+3) mod 7 counts days since Monday.
		return Window{Period: p, Day: d - Day(((int64(d)+3)%7+7)%7)}
	case PeriodMonth:
		y, m, _ := t.In(loc).Date()
		return Window{Period: p, Day: DayOf(time.Date(y, m, 1, 0, 0, 0, 0, time.UTC))}
	}
	return Window{Period: PeriodDay, Day: DayIn(t, loc)}
}

// WindowOfCounter names the ledger window of a counter window that starts
// at start (Unix seconds) in loc: the calendar window holding its start, so
// the ledger's window is the counter's (with epoch windows, WINDOW_MODE=epoch,
// a week or month is named by the calendar window its start falls in).
func WindowOfCounter(p Period, start int64, loc *time.Location) Window {
	return WindowAt(p, time.Unix(start, 0), loc)
}

// Start is the window's first instant in loc.
func (w Window) Start(loc *time.Location) time.Time {
	if w.Period == PeriodHour {
		return w.Day.Start().Add(time.Duration(w.Hour) * time.Hour)
	}
	y, m, d := w.Day.Start().Date()
	return midnight(y, m, d, loc)
}

// End is the first instant after the window in loc: the start of the next
// window's date (not Start plus a day, which is off by the hour a DST change
// at midnight moved the start).
func (w Window) End(loc *time.Location) time.Time {
	if w.Period == PeriodHour {
		return w.Start(loc).Add(time.Hour)
	}
	y, m, d := w.Day.Start().Date()
	switch w.Period {
	case PeriodWeek:
		d += 7
	case PeriodMonth:
		m++
	default:
		d++
	}
	return midnight(y, m, d, loc)
}

// midnight is window.Midnight in loc, UTC when nil: the ledger's windows
// start where the service's counter windows do, also where a DST change
// skips midnight.
func midnight(y int, m time.Month, d int, loc *time.Location) time.Time {
	if loc == nil {
		loc = time.UTC
	}
	return window.Midnight(y, m, d, loc)
}

// Next is the window after w.
func (w Window) Next(loc *time.Location) Window { return WindowAt(w.Period, w.End(loc), loc) }

// ExpireAt is when the window's hashes expire: its end plus retentionDays.
func (w Window) ExpireAt(retentionDays int, loc *time.Location) time.Time {
	return w.End(loc).Add(time.Duration(retentionDays) * 24 * time.Hour)
}

// String names the window for people: 2026-10-19T14Z (an hour), 2026-10-19
// (a day), 2026-W43 (an ISO week), 2026-10 (a month).
func (w Window) String() string {
	t := w.Day.Start()
	switch w.Period {
	case PeriodHour:
		return fmt.Sprintf("%sT%02dZ", t.Format("2006-01-02"), w.Hour)
	case PeriodWeek:
		y, wk := t.ISOWeek()
		return fmt.Sprintf("%04d-W%02d", y, wk)
	case PeriodMonth:
		return t.Format("2006-01")
	}
	return t.Format("2006-01-02")
}

// keyPart is the window in a key: a day keeps the layout of day-only
// ledgers (YYYYMMDD); the other periods start with a letter:
// hYYYYMMDDHH, wYYYYMMDD (the Monday), mYYYYMM.
func (w Window) keyPart() string {
	t := w.Day.Start()
	switch w.Period {
	case PeriodHour:
		return fmt.Sprintf("h%s%02d", t.Format(dayLayout), w.Hour)
	case PeriodWeek:
		return "w" + t.Format(dayLayout)
	case PeriodMonth:
		return "m" + t.Format("200601")
	}
	return t.Format(dayLayout)
}

// ID is the window as written in keys and URLs (see ParseWindowID).
func (w Window) ID() string { return w.keyPart() }

// ParseWindowID reads Window.ID, checking that the window is one WindowAt
// makes (a week starts on a Monday).
func ParseWindowID(s string) (Window, bool) {
	if s == "" {
		return Window{}, false
	}
	var w Window
	var layout, date string
	switch s[0] {
	case 'h':
		if len(s) != 11 {
			return Window{}, false
		}
		h, err := strconv.ParseUint(s[9:], 10, 8)
		if err != nil || h > 23 || s[9] == '+' || s[9] == '-' {
			return Window{}, false
		}
		w, layout, date = Window{Period: PeriodHour, Hour: uint8(h)}, dayLayout, s[1:9]
	case 'w':
		w, layout, date = Window{Period: PeriodWeek}, dayLayout, s[1:]
	case 'm':
		w, layout, date = Window{Period: PeriodMonth}, "200601", s[1:]
	default:
		w, layout, date = Window{Period: PeriodDay}, dayLayout, s
	}
	t, err := time.Parse(layout, date)
	if err != nil || t.Format(layout) != date {
		return Window{}, false
	}
	w.Day = DayOf(t)
	if w.Period == PeriodWeek && t.Weekday() != time.Monday {
		return Window{}, false
	}
	return w, true
}
