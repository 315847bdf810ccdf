package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
)

// Windows are the service's calendar windows: hours epoch-aligned, days from
// local midnight, ISO weeks from Monday, months from the 1st, in the zone.
func TestWindowAtBoundaries(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	utc := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, c := range []struct {
		p          Period
		at         string
		loc        *time.Location
		id, name   string
		start, end string
	}{
		{PeriodHour, "2026-10-19T14:59:59Z", nil, "h2026101914", "2026-10-19T14Z", "2026-10-19T14:00:00Z", "2026-10-19T15:00:00Z"},
		// Hours stay epoch-aligned in a zone with a half-hour offset.
		{PeriodHour, "2026-10-19T14:10:00Z", kolkata, "h2026101914", "2026-10-19T14Z", "2026-10-19T14:00:00Z", "2026-10-19T15:00:00Z"},
		{PeriodDay, "2026-10-19T23:59:59Z", nil, "20261019", "2026-10-19", "2026-10-19T00:00:00Z", "2026-10-20T00:00:00Z"},
		// 23:30 UTC is already the next day in Paris.
		{PeriodDay, "2026-10-19T23:30:00Z", paris, "20261020", "2026-10-20", "2026-10-19T22:00:00Z", "2026-10-20T22:00:00Z"},
		// The DST day in Paris is 25 hours long.
		{PeriodDay, "2026-10-25T12:00:00Z", paris, "20261025", "2026-10-25", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"},
		// Sunday 23:59 is still the week of the Monday before; Monday starts the next.
		{PeriodWeek, "2026-10-25T23:59:59Z", nil, "w20261019", "2026-W43", "2026-10-19T00:00:00Z", "2026-10-26T00:00:00Z"},
		{PeriodWeek, "2026-10-26T00:00:00Z", nil, "w20261026", "2026-W44", "2026-10-26T00:00:00Z", "2026-11-02T00:00:00Z"},
		// A week across the year: ISO week 1 of 2027 starts Monday 2027-01-04.
		{PeriodWeek, "2027-01-03T12:00:00Z", nil, "w20261228", "2026-W53", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z"},
		{PeriodMonth, "2026-11-30T23:59:59Z", nil, "m202611", "2026-11", "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z"},
		{PeriodMonth, "2026-11-30T23:30:00Z", paris, "m202612", "2026-12", "2026-11-30T23:00:00Z", "2026-12-31T23:00:00Z"},
		{PeriodMonth, "2028-02-29T12:00:00Z", nil, "m202802", "2028-02", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"},
	} {
		w := WindowAt(c.p, utc(c.at), c.loc)
		if w.ID() != c.id || w.String() != c.name || !w.Start(c.loc).Equal(utc(c.start)) || !w.End(c.loc).Equal(utc(c.end)) {
			t.Errorf("%s %s in %v: %s %s [%s, %s), want %s %s [%s, %s)", c.p, c.at, c.loc, w.ID(), w, w.Start(c.loc).UTC().Format(time.RFC3339), w.End(c.loc).UTC().Format(time.RFC3339), c.id, c.name, c.start, c.end)
		}
		back, ok := ParseWindowID(w.ID())
		if !ok || back != w {
			t.Errorf("%s does not parse back: %v %v", w.ID(), back, ok)
		}
		// The counter window starting at the window's start is the window.
		if got := WindowOfCounter(c.p, w.Start(c.loc).Unix(), c.loc); got != w {
			t.Errorf("counter window of %s = %s", w, got)
		}
		if next := w.Next(c.loc); !next.Start(c.loc).Equal(w.End(c.loc)) {
			t.Errorf("next of %s starts %v", w, next.Start(c.loc))
		}
	}
	for _, bad := range []string{"", "w20261020", "h20261019", "h2026101924", "h20261019-1", "m20261", "m202613", "2026-10-19", "x20261019", "20261032"} {
		if w, ok := ParseWindowID(bad); ok {
			t.Errorf("ParseWindowID(%q) = %v", bad, w)
		}
	}
	if p, ok := ParsePeriod("week"); !ok || p != PeriodWeek || p.String() != "week" {
		t.Errorf("ParsePeriod: %v %v", p, ok)
	}
}

// Where a DST change skips local midnight (America/Santiago and
// America/Havana spring forward at 00:00), time.Date resolves the missing
// 00:00 to 23:00 of the day before. The service's counter windows start that
// day at the transition (internal/ratelimit/window, midnight); the ledger's
// windows are the same spans, and Next moves on from the day before.
func TestWindowsWhereDSTSkipsMidnight(t *testing.T) {
	for _, c := range []struct {
		zone     string
		from, to string // local dates, every day, week and month between is checked
	}{
		{"America/Santiago", "2026-08-20", "2026-09-20"},
		{"America/Santiago", "2030-08-01", "2030-10-01"}, // 2030-09-01, a 1st, is the DST day
		{"America/Havana", "2026-02-25", "2026-03-20"},
	} {
		loc, err := time.LoadLocation(c.zone)
		if err != nil {
			t.Fatal(err)
		}
		svc, err := window.New(window.Options{Location: loc})
		if err != nil {
			t.Fatal(err)
		}
		from, _ := time.ParseInLocation(time.DateOnly, c.from, loc)
		to, _ := time.ParseInLocation(time.DateOnly, c.to, loc)
		for _, u := range []struct {
			p Period
			u window.Unit
		}{{PeriodDay, window.Day}, {PeriodWeek, window.Week}, {PeriodMonth, window.Month}} {
			n := 0
			for w := WindowAt(u.p, from, loc); w.Start(loc).Before(to); w = w.Next(loc) {
				if n++; n > 100 {
					t.Fatalf("%s %s: Next does not move past %s", c.zone, u.p, w)
				}
				at := w.Start(loc).Add(time.Hour)
				start, end, _ := svc.Window(u.u, at)
				if !w.Start(loc).Equal(start) || !w.End(loc).Equal(end) {
					t.Errorf("%s %s %s: [%s, %s), the service's window is [%s, %s)", c.zone, u.p, w, w.Start(loc), w.End(loc), start, end)
				}
				if got := WindowOfCounter(u.p, start.Unix(), loc); got != w {
					t.Errorf("%s: the counter window starting %s is %s, want %s", c.zone, start, got, w)
				}
				if next := w.Next(loc); next == w || !next.Start(loc).Equal(w.End(loc)) {
					t.Errorf("%s: next of %s is %s starting %s, want one starting %s", c.zone, w, next, next.Start(loc), w.End(loc))
				}
			}
		}
	}
}

// Denials are counted per principal, within a bound past which only the
// window's totals grow; a window's hashes get their expiry while the window
// is current and a day after, then the recorder forgets them.
func TestRecorderWindowsAndPrincipalDenials(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	mem := NewMemory("", clock)
	rec, err := NewRecorder(Options{MaxPendingPrincipals: 2}, mem, clock)
	if err != nil {
		t.Fatal(err)
	}
	r := RuleID{"budget", "set/per-run"}
	mw := WindowAt(PeriodMonth, now, nil)
	for _, p := range []string{"a", "b", "a", "c"} {
		rec.DeniedIn(r, mw, Denial{Principal: p, Shadow: true})
	}
	rec.DeniedIn(r, mw, Denial{Principal: "a", Reserve: true})
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	d, _ := mem.Read(ctx, r, mw)
	if d.Denials != (Denials{Shadow: 4, Enforce: 1, Reserve: 1}) {
		t.Fatalf("totals %+v", d.Denials)
	}
	if d.PrincipalDenials["a"] != (Denials{Shadow: 2, Enforce: 1, Reserve: 1}) || d.PrincipalDenials["b"] != (Denials{Shadow: 1}) {
		t.Fatalf("per principal %+v", d.PrincipalDenials)
	}
	if _, ok := d.PrincipalDenials["c"]; ok {
		t.Fatalf("c is past the bound of 2 principals, got %+v", d.PrincipalDenials)
	}
	// The bound is per flush: c is counted after it.
	rec.DeniedIn(r, mw, Denial{Principal: "c", Shadow: true})
	_ = rec.Flush(ctx)
	if d, _ := mem.Read(ctx, r, mw); d.PrincipalDenials["c"] != (Denials{Shadow: 1}) {
		t.Fatalf("after the flush: %+v", d.PrincipalDenials)
	}
	want := time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC) // the month's end + 10 days
	if exp := mem.TTL(WindowStatsKey("", r, mw)); !exp.Equal(want) {
		t.Fatalf("month expiry %v, want %v", exp, want)
	}
	// A day after the month ended, its keys are no longer re-expired.
	now = time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	if got := rec.expiries(); len(got) != 0 {
		t.Fatalf("expiries of an old window: %v", got)
	}
}
