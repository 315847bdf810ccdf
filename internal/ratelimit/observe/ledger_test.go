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
