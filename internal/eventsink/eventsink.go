// Package eventsink delivers threshold events out of the process: each
// 80/90/100% crossing becomes a CloudEvent (specversion 1.0, JSON structured
// mode) POSTed to a configured URL.
//
// Delivery never holds up a rate limit decision: Offer only tries to put the
// event on a bounded queue and returns; a full queue drops the event and
// counts it. One worker sends the queue in order, retrying network errors,
// 5xx and 429 answers with exponential backoff, up to MaxAttempts; an event
// still undelivered (or refused with another 4xx) is dropped and counted.
// The event id is derived from (domain, rule, principal, day, threshold and
// the counter window), so
// a receiver can drop the duplicates a retry after a lost answer produces.
package eventsink

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// CloudEvents attributes of every event.
const (
	SpecVersion     = "1.0"
	EventType       = "dev.budgetgen.ratelimit.threshold.crossed"
	DefaultSource   = "budgetgen/ratelimit"
	DataContentType = "application/json"
	// ContentType is the structured-mode media type (CloudEvents HTTP binding).
	ContentType = "application/cloudevents+json; charset=UTF-8"
)

// Defaults of Options.
const (
	DefaultQueueSize      = 1024
	DefaultMaxAttempts    = 5
	DefaultInitialBackoff = 200 * time.Millisecond
	DefaultMaxBackoff     = 10 * time.Second
	DefaultTimeout        = 5 * time.Second
	// maxResponseBody bounds what is read of an answer (it is discarded).
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
	ReasonRejected      = "rejected"      // a 4xx other than 408/429
	ReasonClosed        = "closed"        // offered after Close, or left at shutdown
)

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

// Event is a CloudEvent in JSON structured mode.
type Event struct {
	SpecVersion     string   `json:"specversion"`
	ID              string   `json:"id"`
	Source          string   `json:"source"`
	Type            string   `json:"type"`
	Time            string   `json:"time"`
	DataContentType string   `json:"datacontenttype"`
	Subject         string   `json:"subject,omitempty"`
	Data            Crossing `json:"data"`
}

// NewEvent builds the CloudEvent of a crossing.
func NewEvent(source string, c Crossing) Event {
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
	return Event{
		SpecVersion: SpecVersion, ID: hex.EncodeToString(h.Sum(nil)[:16]), Source: source, Type: EventType,
		Time: c.At.UTC().Format(time.RFC3339Nano), DataContentType: DataContentType, Subject: c.Rule, Data: c,
	}
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
	// InitialBackoff doubles after each failed attempt up to MaxBackoff.
	InitialBackoff, MaxBackoff time.Duration
	// Timeout bounds one attempt; default DefaultTimeout.
	Timeout time.Duration
	// Client sends the requests; default a client with Timeout.
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
	target    string // scheme://host/path for logs, no userinfo or query
	queue     chan Event
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
	if o.MaxBackoff == 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.QueueSize < 1 || o.MaxAttempts < 1 || o.InitialBackoff < 0 || o.MaxBackoff < o.InitialBackoff || o.Timeout < 0 {
		return nil, fmt.Errorf("threshold events: queue %d, attempts %d, backoff %v..%v, timeout %v: out of range", o.QueueSize, o.MaxAttempts, o.InitialBackoff, o.MaxBackoff, o.Timeout)
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: o.Timeout}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &HTTP{
		o: o, target: u.Scheme + "://" + u.Host + u.Path, queue: make(chan Event, o.QueueSize),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricDropped, Help: "Threshold events not delivered to the configured URL, by reason.",
		}, []string{"reason"}),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricDelivered, Help: "Threshold events delivered to the configured URL.",
		}),
		done: make(chan struct{}),
	}
	for _, r := range []string{ReasonQueueFull, ReasonUndeliverable, ReasonRejected, ReasonClosed} {
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

// Offer queues the event of a crossing, or drops and counts it when the
// queue is full or the sink closed. It never blocks.
func (s *HTTP) Offer(c Crossing) {
	ev := NewEvent(s.o.Source, c)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		s.dropped.WithLabelValues(ReasonClosed).Inc()
		return
	}
	select {
	case s.queue <- ev:
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
	for ev := range s.queue {
		if ctx.Err() != nil {
			s.dropped.WithLabelValues(ReasonClosed).Inc()
			continue
		}
		switch reason := s.deliver(ctx, ev); reason {
		case "":
			s.delivered.Inc()
		default:
			s.dropped.WithLabelValues(reason).Inc()
			s.o.Logger.Warn("threshold event dropped", "reason", reason, "target", s.target, "id", ev.ID, "rule", ev.Data.Rule, "threshold_percent", ev.Data.ThresholdPercent)
		}
	}
}

// deliver sends one event with retries; "" when delivered, else the reason.
func (s *HTTP) deliver(ctx context.Context, ev Event) string {
	body, err := json.Marshal(ev)
	if err != nil {
		return ReasonRejected
	}
	backoff := s.o.InitialBackoff
	for attempt := 1; ; attempt++ {
		retry, err := s.post(ctx, body)
		if err == nil {
			return ""
		}
		if ctx.Err() != nil {
			return ReasonClosed // abandoned at shutdown
		}
		if !retry {
			return ReasonRejected
		}
		if attempt >= s.o.MaxAttempts {
			return ReasonUndeliverable
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ReasonClosed
		case <-t.C:
		}
		backoff = min(2*backoff, s.o.MaxBackoff)
	}
}

// post sends one attempt; retry tells whether a failure is worth another.
func (s *HTTP) post(ctx context.Context, body []byte) (retry bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.o.URL, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", ContentType)
	resp, err := s.o.Client.Do(req)
	if err != nil {
		return true, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBody))
	_ = resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return false, nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode >= 500:
		return true, fmt.Errorf("status %d", resp.StatusCode)
	}
	return false, fmt.Errorf("status %d", resp.StatusCode)
}
