// Package window computes the fixed windows counters live in: calendar windows
// (a day from local midnight, an ISO 8601 week from Monday 00:00, a month from
// the 1st, a year from January 1st, in a configurable time zone, UTC by
// default) or the reference service's epoch windows (envoyproxy/ratelimit's
// utils.UnitToDivider: multiples of a fixed length counted from 1970-01-01
// 00:00 UTC, so a WEEK starts on Thursdays, a MONTH is 30 days and a YEAR 365).
//
// Seconds, minutes and hours are epoch-aligned in both modes: every zone in
// use today is offset from UTC by whole quarter hours at most, and an hour
// that followed the zone would be ambiguous on DST days.
//
// It is pure arithmetic over Unix seconds and a *time.Location, safe for
// concurrent use, and allocates nothing.
package window

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// Unit is a window unit. Its values are the RLS proto's
// RateLimitResponse.RateLimit.Unit, so a proto unit converts with Unit(u).
type Unit int32

// Units, numbered as in envoy.service.ratelimit.v3.
const (
	Unknown Unit = 0
	Second  Unit = 1
	Minute  Unit = 2
	Hour    Unit = 3
	Day     Unit = 4
	Month   Unit = 5
	Year    Unit = 6
	Week    Unit = 7
)

func (u Unit) String() string {
	switch u {
	case Second:
		return "second"
	case Minute:
		return "minute"
	case Hour:
		return "hour"
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return fmt.Sprintf("Unit(%d)", int32(u))
}

const day = 86400

// epochMonday is the first Monday after the Unix epoch (1970-01-05, the
// epoch itself was a Thursday).
const epochMonday = 4 * day

// Divider is the reference's fixed window length in seconds for a unit
// (utils.UnitToDivider): the length of every epoch window, and the nominal
// length of a calendar one. 0 for Unknown or an out-of-range unit.
func Divider(u Unit) int64 {
	switch u {
	case Second:
		return 1
	case Minute:
		return 60
	case Hour:
		return 3600
	case Day:
		return day
	case Week:
		return 7 * day
	case Month:
		return 30 * day
	case Year:
		return 365 * day
	}
	return 0
}

// Mode chooses calendar or epoch windows.
type Mode uint8

const (
	// Calendar windows are the default.
	Calendar Mode = iota
	// Epoch windows are the reference's, for installs that must keep its
	// exact counters and resets.
	Epoch
)

// ModeNames are the accepted names of the modes (WINDOW_MODE).
var ModeNames = []string{"calendar", "epoch"}

func (m Mode) String() string {
	if int(m) < len(ModeNames) {
		return ModeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", m)
}

// ParseMode parses calendar or epoch (case-insensitive); "" is calendar.
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "calendar":
		return Calendar, nil
	case "epoch":
		return Epoch, nil
	}
	return Calendar, fmt.Errorf("unknown window mode %q (want calendar or epoch)", s)
}

// Options configure a Clock's windows. The zero value is calendar windows in UTC.
type Options struct {
	// Mode, default Calendar.
	Mode Mode
	// Location is the time zone of calendar day, week, month and year
	// windows; default UTC. Ignored in Epoch mode (the reference has no zone).
	Location *time.Location
}

// Windows computes windows for one configuration. The zero value is calendar
// windows in UTC. Copy it freely.
type Windows struct {
	epoch bool
	loc   *time.Location // nil: UTC fast path
	// last remembers, per unit, the calendar window computed last, so the
	// hot path (every request in the same month) is two compares instead of
	// civil-date arithmetic and zone lookups. Shared by copies; nil in the
	// zero value (then nothing is remembered).
	last *[Week + 1]atomic.Pointer[span]
}

type span struct{ start, end int64 }

// New returns the windows of o.
func New(o Options) (Windows, error) {
	if o.Mode > Epoch {
		return Windows{}, fmt.Errorf("window: unknown mode %d", o.Mode)
	}
	w := Windows{epoch: o.Mode == Epoch, last: new([Week + 1]atomic.Pointer[span])}
	if o.Location != nil && o.Location != time.UTC && o.Location.String() != "UTC" {
		w.loc = o.Location
	}
	return w, nil
}

// Mode returns the windows' mode.
func (w Windows) Mode() Mode {
	if w.epoch {
		return Epoch
	}
	return Calendar
}

// Location returns the calendar time zone (UTC by default).
func (w Windows) Location() *time.Location {
	if w.loc == nil {
		return time.UTC
	}
	return w.loc
}

// Bounds returns the window of unit u holding the Unix second now:
// start <= now < end, in Unix seconds. ok is false for an unknown unit.
func (w Windows) Bounds(u Unit, now int64) (start, end int64, ok bool) {
	div := Divider(u)
	if div == 0 {
		return 0, 0, false
	}
	if w.epoch || u <= Hour {
		start = floorDiv(now, div) * div
		return start, start + div, true
	}
	if w.last != nil {
		if sp := w.last[u].Load(); sp != nil && sp.start <= now && now < sp.end {
			return sp.start, sp.end, true
		}
		start, end = w.calendar(u, now)
		w.last[u].Store(&span{start, end})
		return start, end, true
	}
	start, end = w.calendar(u, now)
	return start, end, true
}

// calendar computes the calendar window of a day, week, month or year unit.
func (w Windows) calendar(u Unit, now int64) (start, end int64) {
	if w.loc == nil {
		switch u {
		case Day:
			start = floorDiv(now, day) * day
			return start, start + day
		case Week:
			start = floorDiv(now-epochMonday, 7*day)*7*day + epochMonday
			return start, start + 7*day
		}
		// Months and years: civil dates of days since the epoch.
		y, m, _ := civil(floorDiv(now, day))
		if u == Year {
			m = 1
		}
		start = daysFromCivil(y, m, 1) * day
		if u == Year {
			return start, daysFromCivil(y+1, 1, 1) * day
		}
		if m == 12 {
			return start, daysFromCivil(y+1, 1, 1) * day
		}
		return start, daysFromCivil(y, m+1, 1) * day
	}
	t := time.Unix(now, 0).In(w.loc)
	y, mo, d := t.Date()
	switch u {
	case Day:
		return midnight(y, mo, d, w.loc), midnight(y, mo, d+1, w.loc)
	case Week:
		d -= (int(t.Weekday()) + 6) % 7 // back to Monday
		return midnight(y, mo, d, w.loc), midnight(y, mo, d+7, w.loc)
	case Month:
		return midnight(y, mo, 1, w.loc), midnight(y, mo+1, 1, w.loc)
	default: // Year
		return midnight(y, 1, 1, w.loc), midnight(y+1, 1, 1, w.loc)
	}
}

// Window is Bounds over time.Time; the times are in the windows' location
// (UTC in Epoch mode). ok is false for an unknown unit.
func (w Windows) Window(u Unit, t time.Time) (start, end time.Time, ok bool) {
	s, e, ok := w.Bounds(u, t.Unix())
	if !ok {
		return time.Time{}, time.Time{}, false
	}
	loc := w.Location()
	if w.epoch {
		loc = time.UTC
	}
	return time.Unix(s, 0).In(loc), time.Unix(e, 0).In(loc), true
}

func midnight(y int, m time.Month, d int, loc *time.Location) int64 {
	return Midnight(y, m, d, loc).Unix()
}

// Midnight is the first instant of the civil date (y, m, d) in loc (d and m
// may overflow; time.Date normalizes them). Where a DST change skips
// midnight (the clock jumps from 23:59:59 to 01:00), the day starts at the
// transition: time.Date may resolve the missing 00:00 to 23:00 of the day
// before, which would put an hour of yesterday into today's window. The
// ledger starts its windows here too, so they are the counters' windows.
func Midnight(y int, m time.Month, d int, loc *time.Location) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	if t.Hour() != 0 || t.Minute() != 0 {
		if _, end := t.ZoneBounds(); !end.IsZero() && t.Hour() > 12 {
			t = end // 23:xx of the day before: the day starts at the transition
		}
	}
	return t
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// civil converts days since 1970-01-01 to a proleptic Gregorian date
// (Howard Hinnant's civil_from_days).
func civil(z int64) (y int, m time.Month, d int) {
	z += 719468
	era := floorDiv(z, 146097)
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	yy := yoe + era*400
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	dd := doy - (153*mp+2)/5 + 1
	mm := mp + 3
	if mm > 12 {
		mm -= 12
	}
	if mm <= 2 {
		yy++
	}
	return int(yy), time.Month(mm), int(dd)
}

// daysFromCivil is the inverse of civil (Hinnant's days_from_civil).
func daysFromCivil(y int, m time.Month, d int) int64 {
	yy := int64(y)
	if m <= 2 {
		yy--
	}
	era := floorDiv(yy, 400)
	yoe := yy - era*400
	mm := int64(m)
	if mm > 2 {
		mm -= 3
	} else {
		mm += 9
	}
	doy := (153*mm+2)/5 + int64(d) - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}
