package observe

import (
	"context"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
	"github.com/budgetgen/budgetgen/internal/store"
)

// TestLedgerMeasuresEveryWindow: hour, day, week and month rules each write
// their usage into their own counter window's hash (one field per counter),
// a minute rule none; a check over the cap is a denial of its principal, and
// a check over only because of reservations (Item.ReserveDenied) is also a
// reservation denial.
func TestLedgerMeasuresEveryWindow(t *testing.T) {
	cfg, err := config.Load([]config.File{{Name: "t.yaml", Data: []byte(`domain: d
descriptors:
  - {key: h, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: day, rate_limit: {unit: day, requests_per_unit: 10}}
  - {key: w, rate_limit: {unit: week, requests_per_unit: 10}}
  - {key: m, shadow_mode: true, rate_limit: {unit: month, requests_per_unit: 10}}
  - {key: min, rate_limit: {unit: minute, requests_per_unit: 10}}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	now := time.Date(2026, 10, 31, 23, 30, 0, 0, time.UTC) // already November 1 in Paris
	clock := func() time.Time { return now }
	mem := ledger.NewMemory("", clock)
	rec, err := ledger.NewRecorder(ledger.Options{Location: paris}, mem, clock)
	if err != nil {
		t.Fatal(err)
	}
	o := &Ledger{Recorder: rec}
	wins, err := window.New(window.Options{Location: paris})
	if err != nil {
		t.Fatal(err)
	}
	planner := decide.Planner{Windows: wins}
	ctx := context.Background()
	want := map[string]ledger.Window{}
	for i, l := range cfg.Limits() {
		entries := []*rlcommon.RateLimitDescriptor_Entry{{Key: l.Path[0].Key, Value: "alice"}}
		start, _, _ := decide.Window(planner.Windows, l.Unit, now.Unix())
		it := &decide.Item{Limit: l, Hits: 3, Free: 1, WindowStart: start}
		d := &Descriptor{Domain: "d", Entries: entries, Item: it, Now: now}
		var c store.Counter
		o.Annotate(d, &c)
		if l.Path[0].Key == "min" {
			if c.Ledger.Key != "" {
				t.Errorf("a minute rule is measured: %+v", c.Ledger)
			}
			continue
		}
		if c.Ledger.Key == "" || c.Ledger.Field != "alice" {
			t.Fatalf("%s: no usage write", l.Rule)
		}
		mem.HIncrBy(c.Ledger.Key, c.Ledger.Field, it.Hits)
		// A check over the cap; the month's only because of reservations.
		check := &decide.Item{Limit: l, Free: 1, WindowStart: start, Over: true, ReserveDenied: i == 3}
		o.Descriptor(ctx, &Descriptor{Domain: "d", Entries: entries, Item: check, Now: now})
		_, w, _, _ := ledger.ParseKey("", c.Ledger.Key)
		want[l.Path[0].Key] = w
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for key, id := range map[string]string{"h": "h2026103123", "day": "20261101", "w": "w20261026", "m": "m202611"} {
		w := want[key]
		if w.ID() != id {
			t.Errorf("%s: window %s, want %s (the counter's, in Paris)", key, w.ID(), id)
		}
		d, _ := mem.Read(ctx, ledger.RuleID{Domain: "d", Rule: "d." + key}, w)
		wantDenials := ledger.Denials{Enforce: 1}
		if key == "m" {
			wantDenials = ledger.Denials{Shadow: 1, Reserve: 1}
		}
		if d.Usage["alice"] != 3 || d.Denials != wantDenials || d.PrincipalDenials["alice"] != wantDenials {
			t.Errorf("%s: %+v, want usage 3 and denials %+v", key, d, wantDenials)
		}
	}
}

// TestLedgerCountsHolds: a check that placed a hold adds one hold and its
// reserve to its window's totals, in shadow mode as in enforce mode; a call
// that found holds expired adds their units; a minute rule, a failed store
// call and an item holding nothing add none.
func TestLedgerCountsHolds(t *testing.T) {
	cfg, err := config.Load([]config.File{{Name: "t.yaml", Data: []byte(`domain: d
descriptors:
  - {key: day, rate_limit: {unit: day, requests_per_unit: 100000}}
  - {key: s, shadow_mode: true, rate_limit: {unit: hour, requests_per_unit: 100000}}
  - {key: min, rate_limit: {unit: minute, requests_per_unit: 100000}}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 10, 20, 9, 30, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	mem := ledger.NewMemory("", clock)
	rec, err := ledger.NewRecorder(ledger.Options{}, mem, clock)
	if err != nil {
		t.Fatal(err)
	}
	o := &Ledger{Recorder: rec}
	ctx := context.Background()
	send := func(l *config.RateLimit, it decide.Item, storeFailed bool) {
		start, _, _ := decide.Window(window.Windows{}, l.Unit, now.Unix())
		it.Limit, it.Free, it.WindowStart = l, 1, start
		o.Descriptor(ctx, &Descriptor{Domain: "d", Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: l.Path[0].Key, Value: "run-1"}}, Item: &it, Now: now, StoreFailed: storeFailed})
	}
	for _, l := range cfg.Limits() {
		send(l, decide.Item{Reserve: 50_000, Held: true, Reserved: 50_000}, false)
		send(l, decide.Item{Reserve: 50_000, Held: true, Reserved: 100_000}, false)
		send(l, decide.Item{Reserve: 50_000, Over: true, ReserveDenied: true, Reserved: 100_000}, false) // denied: holds nothing
		send(l, decide.Item{Hits: 42_000, Reserved: 50_000}, false)                                      // a charge releasing a hold
		send(l, decide.Item{Reserve: 20_000, Held: true, Expired: 50_000, Reserved: 70_000}, false)      // found the other hold expired
		send(l, decide.Item{Reserve: 50_000, Held: true, Expired: 9, Reserved: 50_000}, true)            // the store failed: nothing is known
		send(l, decide.Item{Reserve: 50_000, Cached: true, Over: true}, false)                           // the over-limit cache answered
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := ledger.Holds{Count: 3, Held: 120_000, Expired: 50_000}
	for key, p := range map[string]ledger.Period{"day": ledger.PeriodDay, "s": ledger.PeriodHour} {
		w := ledger.WindowAt(p, now, nil)
		d, _ := mem.Read(ctx, ledger.RuleID{Domain: "d", Rule: "d." + key}, w)
		if d.Holds != want {
			t.Errorf("%s: holds %+v, want %+v", key, d.Holds, want)
		}
	}
	keys, _ := mem.Keys(ctx, nil)
	for _, k := range keys {
		if k.Rule.Rule == "d.min" {
			t.Errorf("a minute rule is measured: %+v", k)
		}
	}
}
