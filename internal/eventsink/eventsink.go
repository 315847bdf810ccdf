// Package eventsink delivers threshold events out of the process: each
// 80/90/100% crossing becomes a CloudEvent (specversion 1.0, JSON structured
// mode) sent to a configured URL with the CloudEvents Go SDK
// (github.com/cloudevents/sdk-go/v2: its event type, validation and HTTP
// protocol binding).
//
// Delivery never holds up a rate limit decision: Offer only tries to put the
// event on a bounded queue and returns; a full queue drops the event and
// counts it. One worker sends the queue in order, retrying network errors,
// 5xx, 408 and 429 answers with exponential backoff, up to MaxAttempts; an
// event still undelivered (or refused with another 4xx) is dropped and
// counted. The event id is derived from (domain, rule, principal, day,
// threshold and the counter window), so a receiver can drop the duplicates
// a retry after a lost answer produces.
package eventsink

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cecontext "github.com/cloudevents/sdk-go/v2/context"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// CloudEvents attributes of every event.
const (
	SpecVersion     = cloudevents.VersionV1
	EventType       = "dev.budgetgen.ratelimit.threshold.crossed"
	DefaultSource   = "budgetgen/ratelimit"
	DataContentType = cloudevents.ApplicationJSON
	// ContentType is the structured-mode media type (CloudEvents HTTP
	// binding) the SDK sends.
	ContentType = cloudevents.ApplicationCloudEventsJSON
)

// Defaults of Options.
const (
	DefaultQueueSize      = 1024
	DefaultMaxAttempts    = 5
	DefaultInitialBackoff = 200 * time.Millisecond
	DefaultTimeout        = 5 * time.Second
	// maxResponseBody bounds what is read of an answer: the SDK reads a
	// refusal's whole body into its error.
	maxResponseBody = 64 << 10
)

// Metric names.
const (
	MetricDropped   = "budgetgen_ratelimit_threshold_events_dropped_total"
	MetricDelivered = "budgetgen_ratelimit_threshold_events_delivered_total"
)

// Drop reasons, the label of MetricDropped.
const (
	ReasonQueueFull     = "queue_full"
	ReasonUndeliverable = "undeliverable" // retries exhausted
	ReasonRejected      = "rejected"      // a 4xx other than 408/429, or an invalid event
	ReasonClosed        = "closed"        // offered after Close, or left at shutdown
)

// Reasons lists the drop reasons (every one is exported at 0 from the start).
var Reasons = []string{ReasonQueueFull, ReasonUndeliverable, ReasonRejected, ReasonClosed}

// Crossing is one threshold crossing, the event's data.
type Crossing struct {
	Domain           string `json:"domain"`
	Rule             string `json:"rule"`
	Principal        string `json:"principal"`
	ThresholdPercent int    `json:"thresholdPercent"`
	Used             uint64 `json:"used"`
	Cap              uint64 `json:"cap"`
	Shadow           bool   `json:"shadow"`
	// Day is the UTC day (YYYY-MM-DD) of the crossing.
	Day string `json:"day"`
	// Window is the counter window's period (hour, day, week, month) and
	// WindowStart its first instant (RFC 3339, UTC): a crossing happens once
	// per window, so they are part of the event id.
	Window      string `json:"window,omitempty"`
	WindowStart string `json:"windowStart,omitempty"`
	// At is when the crossing was seen; the event's time.
	At time.Time `json:"-"`
}

// EventID is the id of a crossing's event: the same crossing always gets
// the same id.
func EventID(c Crossing) string {
	h := sha256.New()
	parts := []string{c.Domain, c.Rule, c.Principal, c.Day, strconv.Itoa(c.ThresholdPercent)}
	if c.WindowStart != "" {
		// An hour window crosses again the next hour of the same day.
		parts = append(parts, c.Window, c.WindowStart)
	}
	for _, s := range parts {
		// Length-prefixed, so no two tuples hash the same input.
		_, _ = fmt.Fprintf(h, "%d:%s", len(s), s) // hash.Hash.Write never returns an error
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// NewEvent builds and validates the CloudEvent of a crossing.
func NewEvent(source string, c Crossing) (cloudevents.Event, error) {
	ev := cloudevents.NewEvent(SpecVersion)
	ev.SetID(EventID(c))
	ev.SetSource(source)
	ev.SetType(EventType)
	ev.SetTime(c.At.UTC())
	ev.SetSubject(c.Rule)
	if err := ev.SetData(DataContentType, c); err != nil {
		return ev, fmt.Errorf("threshold event data: %w", err)
	}
	return ev, ev.Validate()
}

// Options for New. URL is required; zero values take the defaults.
type Options struct {
	// URL receives a POST per event (http or https).
	URL string
	// Source is the events' source attribute; default DefaultSource.
	Source string
	// QueueSize bounds the events waiting; default DefaultQueueSize.
	QueueSize int
	// MaxAttempts per event (first try included); default DefaultMaxAttempts.
	MaxAttempts int
	// InitialBackoff is the wait after the first failed attempt; it doubles
	// after each further one (the SDK's exponential backoff).
	InitialBackoff time.Duration
	// Timeout bounds one attempt; default DefaultTimeout.
	Timeout time.Duration
	// Client sends the requests; default a client with Timeout. Its
	// transport is wrapped so that at most 64 KiB of an answer is read.
	Client *http.Client
	// Registerer gets the dropped and delivered counters; nil keeps them
	// unregistered.
	Registerer prometheus.Registerer
	// Logger gets a warning per dropped event (never the URL's secrets);
	// default slog.Default().
	Logger *slog.Logger
}

// HTTP is the sink. Safe for concurrent use.
type HTTP struct {
	o         Options
	target    string // scheme://host for logs: no userinfo, path or query (webhooks often carry their secret in the path)
	client    cloudevents.Client
	sdkLog    *zap.SugaredLogger // a no-op: see deliver
	queue     chan Crossing
	dropped   *prometheus.CounterVec
	delivered prometheus.Counter

	mu     sync.RWMutex
	closed bool
	stop   context.CancelFunc
	done   chan struct{}
}

// New validates o, registers the counters and starts the worker.
func New(o Options) (*HTTP, error) {
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("threshold events URL: want an absolute http:// or https:// URL")
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	client, err := newClient(o)
	if err != nil {
		return nil, err
	}
	s := &HTTP{
		o: o, target: u.Scheme + "://" + u.Host, client: client, sdkLog: zap.NewNop().Sugar(), queue: make(chan Crossing, o.QueueSize),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricDropped, Help: "Threshold events not delivered to the configured URL, by reason.",
		}, []string{"reason"}),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricDelivered, Help: "Threshold events delivered to the configured URL.",
		}),
		done: make(chan struct{}),
	}
	for _, r := range Reasons {
		s.dropped.WithLabelValues(r) // exported at 0 from the start
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{s.dropped, s.delivered} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("threshold events: register metric: %w", err)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	go s.run(ctx)
	return s, nil
}

// defaults fills the zero values and checks the ranges.
func (o *Options) defaults() error {
	if o.Source == "" {
		o.Source = DefaultSource
	}
	if o.QueueSize == 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.InitialBackoff == 0 {
		o.InitialBackoff = DefaultInitialBackoff
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.QueueSize < 1 || o.MaxAttempts < 1 || o.InitialBackoff < 0 || o.Timeout < 0 {
		return fmt.Errorf("threshold events: queue %d, attempts %d, backoff %v, timeout %v: out of range", o.QueueSize, o.MaxAttempts, o.InitialBackoff, o.Timeout)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// newClient is the SDK's HTTP client for o.URL, retrying what retriable
// says (deliver sets the backoff in each send's context).
func newClient(o Options) (cloudevents.Client, error) {
	hc := http.Client{Timeout: o.Timeout}
	if o.Client != nil {
		hc = *o.Client
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc.Transport = limitedBody{base}
	p, err := cehttp.New(cehttp.WithTarget(o.URL), cehttp.WithClient(hc), cehttp.WithIsRetriableFunc(retriable))
	if err != nil {
		return nil, errors.New("threshold events: cloudevents http protocol: bad options") // its error may quote the URL
	}
	c, err := cloudevents.NewClient(p)
	if err != nil {
		return nil, fmt.Errorf("threshold events: cloudevents client: %w", err)
	}
	return c, nil
}

// Offer queues the event of a crossing, or drops and counts it when the
// queue is full or the sink closed. It never blocks.
func (s *HTTP) Offer(c Crossing) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		s.dropped.WithLabelValues(ReasonClosed).Inc()
		return
	}
	select {
	case s.queue <- c:
	default:
		s.dropped.WithLabelValues(ReasonQueueFull).Inc()
	}
}

// Close stops accepting events and sends what is queued until ctx ends; the
// rest is dropped (counted as closed).
func (s *HTTP) Close(ctx context.Context) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.done
		return
	}
	s.closed = true
	close(s.queue)
	s.mu.Unlock()
	select {
	case <-s.done:
	case <-ctx.Done():
		s.stop()
		<-s.done
	}
}

// Collectors are the sink's counters, for registries built after New.
func (s *HTTP) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.dropped, s.delivered}
}

func (s *HTTP) run(ctx context.Context) {
	defer close(s.done)
	for c := range s.queue {
		if ctx.Err() != nil {
			s.dropped.WithLabelValues(ReasonClosed).Inc()
			continue
		}
		switch reason := s.deliver(ctx, c); reason {
		case "":
			s.delivered.Inc()
		default:
			s.dropped.WithLabelValues(reason).Inc()
			s.o.Logger.Warn("threshold event dropped", "reason", reason, "target", s.target, "id", EventID(c), "rule", c.Rule, "threshold_percent", c.ThresholdPercent)
		}
	}
}

// deliver sends one event in structured mode, with the SDK's exponential
// backoff between attempts; "" when delivered, else the reason.
func (s *HTTP) deliver(ctx context.Context, c Crossing) string {
	ev, err := NewEvent(s.o.Source, c)
	if err != nil {
		return ReasonRejected
	}
	// The SDK waits Period*2^n before retry n (n from 1): the first wait is
	// InitialBackoff.
	sctx := cloudevents.ContextWithRetriesExponentialBackoff(cloudevents.WithEncodingStructured(ctx), s.o.InitialBackoff/2, s.o.MaxAttempts-1)
	// The SDK's own log (zap, to stderr) would bypass LOG_LEVEL and could
	// quote the URL's token in an error: it is silenced; drops are logged
	// here, without the URL's secrets.
	sctx = cecontext.WithLogger(sctx, s.sdkLog)
	res := s.client.Send(sctx, ev)
	if cloudevents.IsACK(res) {
		return ""
	}
	if ctx.Err() != nil {
		return ReasonClosed // abandoned at shutdown
	}
	if rr, ok := res.(*cehttp.RetriesResult); ok {
		res = rr.Result // the last attempt's
	}
	var hr *cehttp.Result
	if cloudevents.ResultAs(res, &hr) && !retriable(hr.StatusCode) {
		return ReasonRejected
	}
	return ReasonUndeliverable
}

// retriable: an answer worth another attempt (no answer at all is one too).
func retriable(code int) bool {
	return code == http.StatusTooManyRequests || code == http.StatusRequestTimeout || code >= 500
}

// limitedBody bounds what is read of every answer.
type limitedBody struct{ rt http.RoundTripper }

func (l limitedBody) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.rt.RoundTrip(r)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.LimitReader(resp.Body, maxResponseBody), resp.Body}
	return resp, nil
}
