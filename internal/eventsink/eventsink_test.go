package eventsink

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/protocol"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var at = time.Date(2026, 10, 20, 14, 3, 4, 0, time.UTC)

func crossing(p int) Crossing {
	return Crossing{Domain: "gw/p", Rule: "gw/p/rule/0", Principal: "run-1", ThresholdPercent: p, Used: uint64(p) * 1000, Cap: 100000, Shadow: true, Day: "2026-10-20", At: at}
}

// receiver is a CloudEvents receiver built with the SDK
// (cloudevents.Client.StartReceiver over its HTTP protocol on a loopback
// listener): what it decodes is what any SDK-based consumer would see.
type receiver struct {
	URL string

	mu     sync.Mutex
	events []cloudevents.Event
	ctypes []string
	status func(n int) int // answer of the n-th event (1-based); default 202
	n      int
}

func newReceiver(t *testing.T, status func(n int) int) *receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rv := &receiver{URL: "http://" + ln.Addr().String() + "/hooks/budget", status: status}
	p, err := cehttp.New(cehttp.WithListener(ln), cehttp.WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rv.mu.Lock()
			rv.ctypes = append(rv.ctypes, r.Header.Get("Content-Type"))
			rv.mu.Unlock()
			next.ServeHTTP(w, r)
		})
	}))
	if err != nil {
		t.Fatal(err)
	}
	c, err := cloudevents.NewClient(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.StartReceiver(ctx, rv.receive) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("receiver: %v", err)
		}
	})
	return rv
}

func (rv *receiver) receive(_ context.Context, ev cloudevents.Event) protocol.Result {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	rv.n++
	rv.events = append(rv.events, ev)
	status := http.StatusAccepted
	if rv.status != nil {
		status = rv.status(rv.n)
	}
	if status/100 == 2 {
		return cloudevents.ResultACK
	}
	return cehttp.NewResult(status, "refused by the test")
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

// TestDeliversStructuredCloudEvents: each crossing reaches an SDK receiver
// as a valid structured-mode CloudEvent with the crossing as JSON data and
// an id derived from the crossing.
func TestDeliversStructuredCloudEvents(t *testing.T) {
	rv := newReceiver(t, nil)
	s, reg := newSink(t, rv.URL, Options{})
	for _, p := range []int{80, 90, 100} {
		s.Offer(crossing(p))
	}
	s.Close(context.Background()) // drains the queue
	if rv.count() != 3 || testutil.ToFloat64(s.delivered) != 3 {
		t.Fatalf("delivered %d (%v)", rv.count(), testutil.ToFloat64(s.delivered))
	}
	ids := map[string]bool{}
	for i, ev := range rv.events {
		if err := ev.Validate(); err != nil {
			t.Errorf("event %d invalid: %v", i, err)
		}
		if ev.SpecVersion() != "1.0" || ev.Type() != EventType || ev.Source() != DefaultSource || ev.DataContentType() != "application/json" ||
			ev.Subject() != "gw/p/rule/0" || !strings.HasPrefix(rv.ctypes[i], "application/cloudevents+json") {
			t.Errorf("event %d: %s (%s)", i, ev, rv.ctypes[i])
		}
		if !ev.Time().Equal(at) {
			t.Errorf("time %v, want %v", ev.Time(), at)
		}
		var got Crossing
		if err := ev.DataAs(&got); err != nil {
			t.Fatal(err)
		}
		want := crossing([]int{80, 90, 100}[i])
		want.At = time.Time{}
		if got != want {
			t.Errorf("data %+v, want %+v", got, want)
		}
		ids[ev.ID()] = true
	}
	if len(ids) != 3 {
		t.Fatalf("ids not distinct: %v", ids)
	}
	// The same crossing has the same id (receivers drop retried duplicates).
	if EventID(crossing(80)) != rv.events[0].ID() {
		t.Fatal("id not derived from the crossing")
	}
	if n, err := testutil.GatherAndCount(reg, MetricDropped, MetricDelivered); err != nil || n != 5 {
		t.Fatalf("metrics %d %v", n, err)
	}
}

func TestRetriesWithBackoffThenDelivers(t *testing.T) {
	// 503, 429, then 202: three attempts of the same event.
	rv := newReceiver(t, func(n int) int { return map[int]int{1: 503, 2: 429}[n] + map[bool]int{true: 202}[n > 2] })
	s, _ := newSink(t, rv.URL, Options{})
	s.Offer(crossing(80))
	s.Close(context.Background())
	if rv.count() != 3 || rv.events[0].ID() != rv.events[2].ID() || testutil.ToFloat64(s.delivered) != 1 || dropped(s, ReasonUndeliverable) != 0 {
		t.Fatalf("attempts %d delivered %v", rv.count(), testutil.ToFloat64(s.delivered))
	}
}

func TestFailingReceiverDropsAndCounts(t *testing.T) {
	rv := newReceiver(t, func(int) int { return 500 })
	s, _ := newSink(t, rv.URL, Options{MaxAttempts: 3})
	s.Offer(crossing(80))
	s.Offer(crossing(90))
	s.Close(context.Background())
	if rv.count() != 6 || dropped(s, ReasonUndeliverable) != 2 || testutil.ToFloat64(s.delivered) != 0 {
		t.Fatalf("attempts %d, undeliverable %v", rv.count(), dropped(s, ReasonUndeliverable))
	}
	// A 400 is not retried.
	rv2 := newReceiver(t, func(int) int { return 400 })
	s2, _ := newSink(t, rv2.URL, Options{MaxAttempts: 3})
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

// TestLargeRefusalBodyIsBounded: a receiver refusing with a huge body has
// at most 64 KiB of it read (the SDK reads a refusal's body into its error).
func TestLargeRefusalBodyIsBounded(t *testing.T) {
	var written sync.WaitGroup
	var sent int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		written.Add(1)
		defer written.Done()
		w.WriteHeader(http.StatusBadRequest)
		chunk := []byte(strings.Repeat("x", 1<<16))
		for range 256 { // 16 MiB, unless the client stops reading
			n, err := w.Write(chunk)
			sent += int64(n)
			if err != nil {
				return
			}
		}
	}))
	s, _ := newSink(t, srv.URL, Options{MaxAttempts: 1})
	s.Offer(crossing(80))
	s.Close(context.Background())
	srv.CloseClientConnections()
	written.Wait()
	srv.Close()
	if dropped(s, ReasonRejected) != 1 {
		t.Fatalf("rejected %v", dropped(s, ReasonRejected))
	}
	if sent >= 16<<20 {
		t.Fatalf("the whole %d-byte refusal was read", sent)
	}
}

// TestDropLogNamesNoPathToken: webhook receivers often take their secret in
// the path (https://hooks.example/services/T0/B0/<secret>); the drop
// warning names the receiver's host, never its path, query or userinfo.
func TestDropLogNamesNoPathToken(t *testing.T) {
	rv := newReceiver(t, func(int) int { return 400 })
	var logs strings.Builder
	var mu sync.Mutex
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logs.Write(p) })
	s, _ := newSink(t, rv.URL+"/path-secret-7?token=query-secret-8", Options{MaxAttempts: 1, Logger: slog.New(slog.NewTextHandler(w, nil))})
	s.Offer(crossing(80))
	s.Close(context.Background())
	mu.Lock()
	defer mu.Unlock()
	if dropped(s, ReasonRejected) != 1 || !strings.Contains(logs.String(), "threshold event dropped") {
		t.Fatalf("no drop logged: %s", logs.String())
	}
	for _, secret := range []string{"path-secret-7", "query-secret-8"} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the log holds the URL's %s: %s", secret, logs.String())
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
