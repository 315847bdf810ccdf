package window

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // the zones below, whatever the machine has installed
)

func mustLoad(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return loc
}

var calendarUnits = []Unit{Second, Minute, Hour, Day, Week, Month, Year}

// zones exercised by the property tests: UTC (fast path), a fixed zone named
// otherwise (forces the time-package path so both agree), two DST zones, and
// one whose DST change skips midnight.
func zones(t testing.TB) []*time.Location {
	return []*time.Location{time.UTC, time.FixedZone("Z0", 0), mustLoad(t, "Europe/Paris"),
		mustLoad(t, "America/New_York"), mustLoad(t, "America/Havana"), mustLoad(t, "Asia/Kolkata")}
}

// checkCalendar asserts what a calendar window of u holding now must be, using
// only the time package as the oracle.
func checkCalendar(t *testing.T, w Windows, u Unit, now int64) {
	t.Helper()
	loc := w.Location()
	s, e, ok := w.Bounds(u, now)
	if !ok {
		t.Fatalf("%v: not ok", u)
	}
	if s > now || now >= e {
		t.Fatalf("%s %v at %s: window [%s, %s) does not hold it", loc, u, time.Unix(now, 0).In(loc), time.Unix(s, 0).In(loc), time.Unix(e, 0).In(loc))
	}
	// Tiling: the window after starts at our end, the one before ends at our start.
	if s2, _, _ := w.Bounds(u, e); s2 != e {
		t.Fatalf("%s %v at %d: next window starts at %d, not at our end %d", loc, u, now, s2, e)
	}
	if _, e0, _ := w.Bounds(u, s-1); e0 != s {
		t.Fatalf("%s %v at %d: previous window ends at %d, not at our start %d", loc, u, now, e0, s)
	}
	if u <= Hour {
		if d := Divider(u); s%d != 0 || e-s != d {
			t.Fatalf("%v at %d: [%d, %d) not epoch-aligned", u, now, s, e)
		}
		return
	}
	tl, st := time.Unix(now, 0).In(loc), time.Unix(s, 0).In(loc)
	// The start is the calendar boundary: the first instant of its local date
	// (local 00:00, or the transition where DST skips midnight).
	if st.Add(-time.Second).YearDay() == st.YearDay() {
		t.Fatalf("%s %v at %s: start %s is not the first second of its date", loc, u, tl, st)
	}
	if st.Hour() != 0 && (st.Hour() != 1 || st.Add(-time.Second).Hour() != 23) {
		t.Fatalf("%s %v at %s: start %s is not midnight", loc, u, tl, st)
	}
	ty, tm, td := tl.Date()
	sy, sm, sd := st.Date()
	switch u {
	case Day:
		if sy != ty || sm != tm || sd != td {
			t.Fatalf("%s day at %s starts on another date %s", loc, tl, st)
		}
		if h := (e - s) / 3600; h < 23 || h > 25 {
			t.Fatalf("%s day at %s lasts %d h", loc, tl, h)
		}
	case Week:
		iy, iw := tl.ISOWeek()
		jy, jw := st.ISOWeek()
		if st.Weekday() != time.Monday || iy != jy || iw != jw {
			t.Fatalf("%s week at %s (ISO %d-W%02d) starts %s %s (ISO %d-W%02d)", loc, tl, iy, iw, st.Weekday(), st, jy, jw)
		}
		if h := (e - s) / 3600; h < 167 || h > 169 {
			t.Fatalf("%s week at %s lasts %d h", loc, tl, h)
		}
	case Month:
		if sy != ty || sm != tm || sd != 1 {
			t.Fatalf("%s month at %s starts %s", loc, tl, st)
		}
		days := time.Date(ty, tm+1, 0, 12, 0, 0, 0, time.UTC).Day() // last day of tm
		if got := time.Unix(e, 0).In(loc).Add(-time.Second).Day(); got != days {
			t.Fatalf("%s month at %s: last day %d, want %d", loc, tl, got, days)
		}
	case Year:
		if sy != ty || sm != time.January || sd != 1 {
			t.Fatalf("%s year at %s starts %s", loc, tl, st)
		}
		if ey := time.Unix(e, 0).In(loc); ey.Year() != ty+1 || ey.YearDay() != 1 {
			t.Fatalf("%s year at %s ends %s", loc, tl, ey)
		}
	}
}

// TestCalendarProperties walks every day of 2000-2100 in each zone: its first
// and last second and a random second of it, for every unit.
func TestCalendarProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 2026))
	for _, loc := range zones(t) {
		w, err := New(Options{Location: loc})
		if err != nil {
			t.Fatal(err)
		}
		w.last = nil // the arithmetic itself; TestCacheMatchesArithmetic covers the cache
		t.Run(loc.String(), func(t *testing.T) {
			end := time.Date(2101, 1, 1, 0, 0, 0, 0, loc)
			for d := time.Date(2000, 1, 1, 0, 0, 0, 0, loc); d.Before(end); d = d.AddDate(0, 0, 1) {
				next := d.AddDate(0, 0, 1).Unix()
				for _, now := range []int64{d.Unix(), next - 1, d.Unix() + rng.Int64N(next-d.Unix())} {
					for _, u := range calendarUnits {
						checkCalendar(t, w, u, now)
					}
				}
			}
		})
	}
}

// TestUTCFastPathMatchesTimePackage: the integer arithmetic used for UTC
// agrees with the time-package path (a zero-offset zone not named UTC).
func TestUTCFastPathMatchesTimePackage(t *testing.T) {
	fast, _ := New(Options{})
	slow, _ := New(Options{Location: time.FixedZone("Z0", 0)})
	if fast.loc != nil || slow.loc == nil {
		t.Fatal("test does not exercise both paths")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	lo, hi := time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(2400, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	for range 200_000 {
		now := lo + rng.Int64N(hi-lo)
		for _, u := range calendarUnits {
			s1, e1, _ := fast.Bounds(u, now)
			s2, e2, _ := slow.Bounds(u, now)
			if s1 != s2 || e1 != e2 {
				t.Fatalf("%v at %s: fast [%d,%d) slow [%d,%d)", u, time.Unix(now, 0).UTC(), s1, e1, s2, e2)
			}
		}
	}
}

// TestCacheMatchesArithmetic: the remembered last window per unit never
// changes an answer, also under concurrent use (run with -race), with times
// going back and forth across boundaries.
func TestCacheMatchesArithmetic(t *testing.T) {
	for _, loc := range zones(t) {
		cached, _ := New(Options{Location: loc})
		plain := cached
		plain.last = nil
		base := time.Date(2026, 3, 28, 0, 0, 0, 0, loc).Unix()
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(g), 9))
				for range 20_000 {
					now := base + rng.Int64N(70*86400) // back and forth over a DST change and month ends
					for _, u := range calendarUnits {
						s1, e1, _ := cached.Bounds(u, now)
						s2, e2, _ := plain.Bounds(u, now)
						if s1 != s2 || e1 != e2 {
							t.Errorf("%s %v at %d: cached [%d,%d) arithmetic [%d,%d)", loc, u, now, s1, e1, s2, e2)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
	}
}

func TestKnownWindows(t *testing.T) {
	paris, ny := mustLoad(t, "Europe/Paris"), mustLoad(t, "America/New_York")
	utc, _ := New(Options{})
	wp, _ := New(Options{Location: paris})
	wn, _ := New(Options{Location: ny})
	ep, _ := New(Options{Mode: Epoch, Location: paris}) // the zone is ignored
	at := func(s string) int64 {
		tt, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tt.Unix()
	}
	for _, c := range []struct {
		name       string
		w          Windows
		u          Unit
		now        string
		start, end string
	}{
		{"leap February", utc, Month, "2024-02-29T23:59:59Z", "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"},
		{"February 2100 is not leap", utc, Month, "2100-02-15T00:00:00Z", "2100-02-01T00:00:00Z", "2100-03-01T00:00:00Z"},
		{"December rolls the year", utc, Month, "2026-12-31T12:00:00Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"ISO week crossing the year", utc, Week, "2027-01-01T08:00:00Z", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z"},
		{"ISO week 53", utc, Week, "2021-01-03T23:59:59Z", "2020-12-28T00:00:00Z", "2021-01-04T00:00:00Z"},
		{"leap year", utc, Year, "2000-12-31T23:59:59Z", "2000-01-01T00:00:00Z", "2001-01-01T00:00:00Z"},
		{"Paris spring-forward day is 23 h", wp, Day, "2026-03-29T12:00:00+02:00", "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00"},
		{"Paris fall-back day is 25 h", wp, Day, "2026-10-25T02:30:00+01:00", "2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00"},
		{"New York spring-forward day", wn, Day, "2026-03-08T03:30:00-04:00", "2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00"},
		{"New York month across DST", wn, Month, "2026-11-30T23:00:00-05:00", "2026-11-01T00:00:00-04:00", "2026-12-01T00:00:00-05:00"},
		{"New York: 02:00 UTC on the 1st is still last month", wn, Month, "2026-12-01T02:00:00Z", "2026-11-01T00:00:00-04:00", "2026-12-01T00:00:00-05:00"},
		{"epoch week starts Thursday", ep, Week, "2026-12-01T10:00:00Z", "2026-11-26T00:00:00Z", "2026-12-03T00:00:00Z"},
		{"epoch month is 30 days", ep, Month, "2026-12-01T10:00:00Z", "2026-11-03T00:00:00Z", "2026-12-03T00:00:00Z"},
		{"epoch day ignores the zone", ep, Day, "2026-12-01T23:30:00Z", "2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z"},
	} {
		s, e, ok := c.w.Bounds(c.u, at(c.now))
		if !ok || s != at(c.start) || e != at(c.end) {
			t.Errorf("%s: got [%s, %s), want [%s, %s)", c.name, time.Unix(s, 0).UTC(), time.Unix(e, 0).UTC(), c.start, c.end)
		}
	}
}

// TestEpochMatchesReference: epoch windows are the reference's
// (now/divider)*divider for every unit, and a week starts on a Thursday.
func TestEpochMatchesReference(t *testing.T) {
	w, _ := New(Options{Mode: Epoch})
	rng := rand.New(rand.NewPCG(3, 4))
	lo, hi := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(2101, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	for range 100_000 {
		now := lo + rng.Int64N(hi-lo)
		for _, u := range calendarUnits {
			div := Divider(u)
			s, e, ok := w.Bounds(u, now)
			if !ok || s != now/div*div || e != s+div {
				t.Fatalf("%v at %d: [%d,%d), reference [%d,%d)", u, now, s, e, now/div*div, now/div*div+div)
			}
			if u == Week && time.Unix(s, 0).UTC().Weekday() != time.Thursday {
				t.Fatalf("epoch week starts %s", time.Unix(s, 0).UTC().Weekday())
			}
		}
	}
}

func TestUnknownUnitAndMode(t *testing.T) {
	w, _ := New(Options{})
	for _, u := range []Unit{Unknown, 8, -1} {
		if _, _, ok := w.Bounds(u, 1000); ok {
			t.Errorf("unit %d accepted", u)
		}
		if _, _, ok := w.Window(u, time.Now()); ok {
			t.Errorf("unit %d accepted by Window", u)
		}
	}
	if _, err := New(Options{Mode: 7}); err == nil {
		t.Error("mode 7 accepted")
	}
	for in, want := range map[string]Mode{"": Calendar, "calendar": Calendar, "EPOCH": Epoch} {
		if m, err := ParseMode(in); err != nil || m != want {
			t.Errorf("ParseMode(%q) = %v, %v", in, m, err)
		}
	}
	if _, err := ParseMode("fixed"); err == nil {
		t.Error("ParseMode(fixed) accepted")
	}
}

func TestWindowTimesAreLocal(t *testing.T) {
	paris := mustLoad(t, "Europe/Paris")
	w, _ := New(Options{Location: paris})
	s, e, _ := w.Window(Month, time.Date(2026, 7, 14, 12, 0, 0, 0, time.UTC))
	if s.Location() != paris || s.Format(time.DateTime) != "2026-07-01 00:00:00" || e.Format(time.DateTime) != "2026-08-01 00:00:00" {
		t.Fatalf("got %s .. %s", s, e)
	}
}

func BenchmarkBounds(b *testing.B) {
	paris := mustLoad(b, "Europe/Paris")
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC).Unix()
	for _, c := range []struct {
		name string
		o    Options
	}{{"epoch", Options{Mode: Epoch}}, {"utc", Options{}}, {"paris", Options{Location: paris}}} {
		w, _ := New(c.o)
		for _, u := range []Unit{Hour, Day, Week, Month} {
			b.Run(c.name+"/"+u.String(), func(b *testing.B) {
				var sink int64
				for i := range b.N {
					s, _, _ := w.Bounds(u, now+int64(i))
					sink += s
				}
				_ = sink
			})
		}
	}
}
