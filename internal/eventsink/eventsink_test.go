package eventsink

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var at = time.Date(2026, 10, 20, 14, 3, 4, 0, time.UTC)

func crossing(p int) Crossing {
	return Crossing{Domain: "gw/p", Rule: "gw/p/rule/0", Principal: "run-1", ThresholdPercent: p, Used: uint64(p) * 1000, Cap: 100000, Shadow: true, Day: "2026-10-20", At: at}
}

// receiver is a real HTTP server recording structured-mode CloudEvents.
type receiver struct {
	mu     sync.Mutex
	events []Event
	raw    []map[string]any
	ctypes []string
	status func(n int) int // answer of the n-th request (1-based)
	n      int
}

func (rv *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	rv.mu.Lock()
	rv.n++
	n := rv.n
	var ev Event
	var raw map[string]any
	_ = json.Unmarshal(body, &ev)
	_ = json.Unmarshal(body, &raw)
	rv.events = append(rv.events, ev)
	rv.raw = append(rv.raw, raw)
	rv.ctypes = append(rv.ctypes, r.Header.Get("Content-Type"))
	status := http.StatusAccepted
	if rv.status != nil {
		status = rv.status(n)
	}
	rv.mu.Unlock()
	w.WriteHeader(status)
}

func (rv *receiver) count() int { rv.mu.Lock(); defer rv.mu.Unlock(); return rv.n }

func newSink(t *testing.T, url string, o Options) (*HTTP, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o.URL, o.Registerer = url, reg
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.InitialBackoff == 0 {
		o.InitialBackoff = time.Millisecond
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s, reg
}

func dropped(s *HTTP, reason string) float64 {
	return testutil.ToFloat64(s.dropped.WithLabelValues(reason))
}

func TestDeliversStructuredCloudEvents(t *testing.T) {
	rv := &receiver{}
	srv := httptest.NewServer(rv)
	defer srv.Close()
	s, reg := newSink(t, srv.URL+"/hooks/budget", Options{})
	for _, p := range []int{80, 90, 100} {
		s.Offer(crossing(p))
	}
	s.Close(context.Background()) // drains the queue
	if rv.count() != 3 || testutil.ToFloat64(s.delivered) != 3 {
		t.Fatalf("delivered %d (%v)", rv.count(), testutil.ToFloat64(s.delivered))
	}
	ids := map[string]bool{}
	for i, ev := range rv.events {
		raw := rv.raw[i]
		for _, attr := range []string{"specversion", "id", "source", "type", "time", "datacontenttype", "data"} {
			if _, ok := raw[attr]; !ok {
				t.Errorf("event %d lacks %s: %v", i, attr, raw)
			}
		}
		if ev.SpecVersion != "1.0" || ev.Type != EventType || ev.Source != DefaultSource || ev.DataContentType != "application/json" || rv.ctypes[i] != ContentType {
			t.Errorf("event %d: %+v (%s)", i, ev, rv.ctypes[i])
		}
		if tm, err := time.Parse(time.RFC3339, ev.Time); err != nil || !tm.Equal(at) {
			t.Errorf("time %q: %v", ev.Time, err)
		}
		want := crossing([]int{80, 90, 100}[i])
		want.At = time.Time{}
		if ev.Data != want {
			t.Errorf("data %+v, want %+v", ev.Data, want)
		}
		ids[ev.ID] = true
	}
	if len(ids) != 3 {
		t.Fatalf("ids not distinct: %v", ids)
	}
	// The same crossing has the same id (receivers drop retried duplicates).
	if NewEvent("x", crossing(80)).ID != rv.events[0].ID {
		t.Fatal("id not derived from the crossing")
	}
	if n, err := testutil.GatherAndCount(reg, MetricDropped, MetricDelivered); err != nil || n != 5 {
		t.Fatalf("metrics %d %v", n, err)
	}
}

func TestRetriesWithBackoffThenDelivers(t *testing.T) {
	// 503, 429, then 202: three attempts of the same event.
	rv := &receiver{status: func(n int) int { return map[int]int{1: 503, 2: 429}[n] + map[bool]int{true: 202}[n > 2] }}
	srv := httptest.NewServer(rv)
	defer srv.Close()
	s, _ := newSink(t, srv.URL, Options{})
	s.Offer(crossing(80))
	s.Close(context.Background())
	if rv.count() != 3 || rv.events[0].ID != rv.events[2].ID || testutil.ToFloat64(s.delivered) != 1 || dropped(s, ReasonUndeliverable) != 0 {
		t.Fatalf("attempts %d delivered %v", rv.count(), testutil.ToFloat64(s.delivered))
	}
}

func TestFailingReceiverDropsAndCounts(t *testing.T) {
	rv := &receiver{status: func(int) int { return 500 }}
	srv := httptest.NewServer(rv)
	defer srv.Close()
	s, _ := newSink(t, srv.URL, Options{MaxAttempts: 3})
	s.Offer(crossing(80))
	s.Offer(crossing(90))
	s.Close(context.Background())
	if rv.count() != 6 || dropped(s, ReasonUndeliverable) != 2 || testutil.ToFloat64(s.delivered) != 0 {
		t.Fatalf("attempts %d, undeliverable %v", rv.count(), dropped(s, ReasonUndeliverable))
	}
	// A 400 is not retried.
	rv2 := &receiver{status: func(int) int { return 400 }}
	srv2 := httptest.NewServer(rv2)
	defer srv2.Close()
	s2, _ := newSink(t, srv2.URL, Options{MaxAttempts: 3})
	s2.Offer(crossing(80))
	s2.Close(context.Background())
	if rv2.count() != 1 || dropped(s2, ReasonRejected) != 1 {
		t.Fatalf("400: attempts %d rejected %v", rv2.count(), dropped(s2, ReasonRejected))
	}
	// Nobody listening: retried, then dropped.
	dead := httptest.NewServer(http.NotFoundHandler())
	url := dead.URL
	dead.Close()
	s3, _ := newSink(t, url, Options{MaxAttempts: 2})
	s3.Offer(crossing(80))
	s3.Close(context.Background())
	if dropped(s3, ReasonUndeliverable) != 1 {
		t.Fatalf("dead receiver: %v", dropped(s3, ReasonUndeliverable))
	}
}

// A receiver that never answers in time: Offer does not wait for it, the
// queue stays bounded and the overflow is counted.
func TestSlowReceiverNeverBlocksOffer(t *testing.T) {
	release := make(chan struct{})
	got := make(chan struct{}, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- struct{}{}
		<-release
	}))
	defer srv.Close()
	defer close(release)
	const queue = 4
	s, _ := newSink(t, srv.URL, Options{QueueSize: queue, MaxAttempts: 1, Timeout: time.Minute})
	s.Offer(crossing(80))
	<-got // the worker is now stuck in that POST
	offered := make(chan struct{})
	go func() {
		for i := 0; i < 99; i++ {
			s.Offer(crossing(90))
		}
		close(offered)
	}()
	select {
	case <-offered:
	case <-time.After(30 * time.Second):
		t.Fatal("Offer blocked behind a slow receiver")
	}
	if d := dropped(s, ReasonQueueFull); d != 99-queue {
		t.Fatalf("dropped %v, want %d", d, 99-queue)
	}
	// Close with an expired deadline: the stuck POST is abandoned and the
	// queued events are counted as dropped at shutdown.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Close(ctx)
	if d := dropped(s, ReasonClosed); d != queue+1 {
		t.Fatalf("closed %v, want %d", d, queue+1)
	}
	s.Offer(crossing(100))
	if d := dropped(s, ReasonClosed); d != queue+2 {
		t.Fatalf("offer after close: %v", d)
	}
}

func TestOptionsRejected(t *testing.T) {
	for _, o := range []Options{{}, {URL: "ftp://x/"}, {URL: "/relative"}, {URL: "http://x", QueueSize: -1}, {URL: "http://x", MaxAttempts: -2}} {
		if _, err := New(o); err == nil {
			t.Errorf("%+v accepted", o)
		} else if strings.Contains(err.Error(), "secret") {
			t.Error(err)
		}
	}
	// The URL's credentials never reach an error.
	if _, err := New(Options{URL: "gopher://user:secret@x/?token=secret"}); err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("error leaks the URL: %v", err)
	}
}
