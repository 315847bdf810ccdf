package thresholds

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/budgetgen/budgetgen/internal/eventsink"
)

func TestThreshold(t *testing.T) {
	for _, tc := range []struct {
		limit uint64
		p     int
		want  uint64
	}{{100, 80, 80}, {5, 80, 4}, {1, 80, 1}, {5000000, 90, 4500000}, {5000000, 100, 5000000}, {math.MaxUint64, 100, math.MaxUint64}, {199, 50, 100}} {
		if got := Threshold(tc.limit, tc.p); got != tc.want {
			t.Errorf("Threshold(%d, %d) = %d, want %d", tc.limit, tc.p, got, tc.want)
		}
	}
}

func TestFirstCrossingOnlyAndNoPrincipalLabel(t *testing.T) {
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	d, err := New(Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	total := uint64(0)
	charge := func(p string, hits uint64) []int {
		total += hits
		return d.Observe(ctx, Charge{Domain: "ns/p", Rule: "ns/p/rule/0", Principal: p, Limit: 1000, Hits: hits, Total: total})
	}
	if got := charge("alice", 799); got != nil {
		t.Fatalf("799/1000 crossed %v", got)
	}
	if got := charge("alice", 1); !reflect.DeepEqual(got, []int{80}) {
		t.Fatalf("800 crossed %v", got)
	}
	if got := charge("alice", 0); got != nil {
		t.Fatalf("a check crossed %v", got)
	}
	if got := charge("alice", 50); got != nil {
		t.Fatalf("850 crossed %v again", got)
	}
	if got := charge("alice", 500); !reflect.DeepEqual(got, []int{90, 100}) {
		t.Fatalf("one big charge should cross 90 and 100 at once, got %v", got)
	}
	if got := charge("alice", 500); got != nil {
		t.Fatalf("over the cap crossed %v again", got)
	}
	if got := d.Observe(ctx, Charge{Limit: 0, Hits: 5, Total: 5}); got != nil {
		t.Fatalf("kill switch crossed %v", got)
	}
	if n := testutil.ToFloat64(d.counter.WithLabelValues("ns/p", "ns/p/rule/0", "day", "90")); n != 1 {
		t.Fatalf("counter 90: %v", n)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "principal" || l.GetValue() == "alice" {
					t.Fatalf("principal leaked into a label: %v", l)
				}
			}
		}
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 events, got %d:\n%s", len(lines), logs.String())
	}
	var ev map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &ev); err != nil {
		t.Fatal(err)
	}
	if ev["event"] != "budget_threshold" || ev["principal"] != "alice" || ev["threshold_percent"] != float64(80) || ev["cap"] != float64(1000) || ev["window"] != "day" {
		t.Fatalf("event %v", ev)
	}
}

// Every window has its thresholds: a month cap crosses 80% once per month,
// an hour cap once per hour, each labelled and logged with its window.
func TestThresholdsForEveryWindow(t *testing.T) {
	var logs bytes.Buffer
	var sink recordingSink
	d, err := New(Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Sink: &sink})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h1 := time.Date(2026, 10, 19, 14, 0, 0, 0, time.UTC)
	for _, c := range []Charge{
		{Domain: "budget", Rule: "s/b#cost", Limit: 5_000_000, Hits: 4_000_000, Total: 4_000_000, Window: "month", WindowStart: time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)},
		{Domain: "budget", Rule: "s/b", Limit: 100, Hits: 80, Total: 80, Window: "hour", WindowStart: h1},
		{Domain: "budget", Rule: "s/b", Limit: 100, Hits: 80, Total: 80, Window: "hour", WindowStart: h1.Add(time.Hour)},
	} {
		if got := d.Observe(ctx, c); !reflect.DeepEqual(got, []int{80}) {
			t.Fatalf("%+v crossed %v", c, got)
		}
	}
	if n := testutil.ToFloat64(d.counter.WithLabelValues("budget", "s/b", "hour", "80")); n != 2 {
		t.Fatalf("hour crossings %v", n)
	}
	if n := testutil.ToFloat64(d.counter.WithLabelValues("budget", "s/b#cost", "month", "80")); n != 1 {
		t.Fatalf("month crossings %v", n)
	}
	if !strings.Contains(logs.String(), `"window":"month","threshold_percent":80`) || !strings.Contains(logs.String(), `"window_start":"2026-10-19T15:00:00Z"`) {
		t.Fatalf("logs:\n%s", logs.String())
	}
	// Two hours of one day are two events, with distinct ids.
	if len(sink.got) != 3 || eventsink.EventID(sink.got[1]) == eventsink.EventID(sink.got[2]) {
		t.Fatalf("events %+v", sink.got)
	}
}

type recordingSink struct{ got []eventsink.Crossing }

func (r *recordingSink) Offer(c eventsink.Crossing) { r.got = append(r.got, c) }

// Concurrent charges on one atomic counter: each threshold is crossed exactly
// once, whichever goroutine (replica) does it.
func TestExactlyOnceUnderConcurrency(t *testing.T) {
	d, _ := New(Options{Logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))})
	var mu sync.Mutex
	var total uint64
	var wg sync.WaitGroup
	counts := map[int]int{}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				mu.Lock()
				total += 7
				tot := total
				mu.Unlock()
				for _, p := range d.Observe(context.Background(), Charge{Limit: 10000, Hits: 7, Total: tot}) {
					mu.Lock()
					counts[p]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if !reflect.DeepEqual(counts, map[int]int{80: 1, 90: 1, 100: 1}) {
		t.Fatalf("crossings %v", counts)
	}
}

func TestBadPercents(t *testing.T) {
	for _, p := range [][]int{{0}, {90, 80}, {80, 80}, {1001}} {
		if _, err := New(Options{Percents: p}); err == nil {
			t.Errorf("%v accepted", p)
		}
	}
}

type sinkFunc func(eventsink.Crossing)

func (f sinkFunc) Offer(c eventsink.Crossing) { f(c) }

// TestSinkGetsEachCrossing: the sink is offered every crossing with the
// injected clock's UTC day.
func TestSinkGetsEachCrossing(t *testing.T) {
	var got []eventsink.Crossing
	at := time.Date(2026, 10, 20, 23, 59, 0, 0, time.FixedZone("x", -3600))
	d, err := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Sink: sinkFunc(func(c eventsink.Crossing) { got = append(got, c) }), Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	d.Observe(context.Background(), Charge{Domain: "d", Rule: "r", Principal: "p", Limit: 10, Hits: 10, Total: 10})
	if len(got) != 3 || got[0].ThresholdPercent != 80 || got[2].ThresholdPercent != 100 || got[2].Used != 10 || got[2].Cap != 10 || got[0].Day != "2026-10-21" || got[0].Principal != "p" {
		t.Fatalf("crossings %+v", got)
	}
	d.Observe(context.Background(), Charge{Domain: "d", Rule: "r", Principal: "p", Limit: 10, Hits: 1, Total: 11})
	if len(got) != 3 {
		t.Fatal("a charge past every threshold was offered")
	}
}
