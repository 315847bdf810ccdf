package engine

import (
	"context"
	"sync"
	"testing"
	"time"
	_ "time/tzdata"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
	"github.com/budgetgen/budgetgen/internal/store"
)

// recordingStore keeps totals in a map and remembers each key's first
// expiry (NX, as the real stores).
type recordingStore struct {
	mu     sync.Mutex
	totals map[string]uint64
	expiry map[string]time.Time
}

func (s *recordingStore) Charge(_ context.Context, cs []store.Counter, totals []store.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, c := range cs {
		s.totals[c.Key] += c.Hits
		if _, ok := s.expiry[c.Key]; !ok && c.Hits > 0 {
			s.expiry[c.Key] = c.ExpireAt
		}
		totals[i] = store.Result{Total: s.totals[c.Key]}
	}
	return nil
}

func (s *recordingStore) Close() error { return nil }

const windowConfig = `domain: d
descriptors:
  - key: day
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: week
    rate_limit: {unit: week, requests_per_unit: 100}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 100}
`

// TestWindowsDriveResetExpiryAndKey: duration_until_reset, the counter's
// absolute expiry (window end + grace) and the key's window all come from the
// configured windows, on a 23-hour DST day in Paris, at a New York month
// boundary, and with the reference's epoch windows.
func TestWindowsDriveResetExpiryAndKey(t *testing.T) {
	paris, _ := time.LoadLocation("Europe/Paris")
	ny, _ := time.LoadLocation("America/New_York")
	for _, c := range []struct {
		name    string
		o       window.Options
		unit    string
		now     time.Time
		resetIn time.Duration
	}{
		{"Paris spring-forward day", window.Options{Location: paris}, "day", time.Date(2026, 3, 29, 0, 0, 0, 0, paris), 23 * time.Hour},
		{"Paris fall-back day", window.Options{Location: paris}, "day", time.Date(2026, 10, 25, 0, 0, 0, 0, paris), 25 * time.Hour},
		{"New York: 03:00 UTC on Dec 1 is November", window.Options{Location: ny}, "month", time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC), 2 * time.Hour},
		{"UTC ISO week from Monday", window.Options{}, "week", time.Date(2026, 12, 6, 23, 0, 0, 0, time.UTC), time.Hour},
		{"UTC calendar month", window.Options{}, "month", time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC), 28 * 24 * time.Hour},
		{"epoch week ends Wednesday night", window.Options{Mode: window.Epoch}, "week", time.Date(2026, 12, 2, 23, 0, 0, 0, time.UTC), time.Hour},
		{"epoch month", window.Options{Mode: window.Epoch}, "month", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), 2 * 24 * time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, err := window.New(c.o)
			if err != nil {
				t.Fatal(err)
			}
			st := &recordingStore{totals: map[string]uint64{}, expiry: map[string]time.Time{}}
			e, err := New(Options{Store: st, Windows: w, Now: func() time.Time { return c.now }, BatchWorkers: -1, Grace: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			e.SetConfig(mustConfig(t, windowConfig))
			resp, err := e.ShouldRateLimit(context.Background(), req("d", 1, d(c.unit, "x")))
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != c.resetIn {
				t.Fatalf("duration_until_reset = %v, want %v", got, c.resetIn)
			}
			end := c.now.Add(c.resetIn)
			var u window.Unit
			switch c.unit {
			case "day":
				u = window.Day
			case "week":
				u = window.Week
			default:
				u = window.Month
			}
			start, _, _ := w.Bounds(u, c.now.Unix())
			k := string(key.Encoder{}.Append(nil, "d", d(c.unit, "x").Entries, nil, end.Unix()-start, start))
			exp, ok := st.expiry[k]
			if !ok {
				t.Fatalf("no counter %q; have %v", k, st.expiry)
			}
			if want := end.Add(time.Minute); !exp.Equal(want) {
				t.Fatalf("expiry %v, want window end + grace %v", exp, want)
			}
		})
	}
}

// BenchmarkDecisionWindows is BenchmarkDecision's request over month limits
// in each window mode: the cost of calendar arithmetic on the hot path
// (docs/benchmarks.md).
func BenchmarkDecisionWindows(b *testing.B) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		o    window.Options
	}{{"epoch", window.Options{Mode: window.Epoch}}, {"calendar-utc", window.Options{}}, {"calendar-paris", window.Options{Location: paris}}} {
		b.Run(c.name, func(b *testing.B) {
			w, _ := window.New(c.o)
			st := &recordingStore{totals: map[string]uint64{}, expiry: map[string]time.Time{}}
			e, err := New(Options{Store: st, Windows: w, BatchWorkers: -1, OverLimitCacheSize: -1})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			e.SetConfig(mustConfigB(b, windowConfig))
			r := req("d", 0, d("month", "alice"), d("day", "alice"))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := e.ShouldRateLimit(context.Background(), r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func mustConfigB(b *testing.B, y string) *config.Config {
	c, err := config.Load([]config.File{{Name: "t.yaml", Data: []byte(y)}})
	if err != nil {
		b.Fatal(err)
	}
	return c
}
