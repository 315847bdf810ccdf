// Package thresholds emits the budgets' alerting hooks: the first time
// in a counter window (an hour, day, ISO week or month: the rule's) that a
// principal's usage crosses 80%, 90% and 100% of its cap, one structured log
// event and one increment of a Prometheus counter labelled by rule, window and
// threshold (never by principal: unbounded label values).
//
// "First time" needs no state: a counter only grows within its window
// and every charge adds to it atomically, so exactly one charge moves it from
// below a threshold to at or above it - across every replica of the service.
// A charge reports (total before, total after); a threshold t is crossed when
// before < t <= after. A counter lost with its store (a restart without
// persistence) starts again from zero and may cross again.
package thresholds

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/budgetgen/budgetgen/internal/eventsink"
)

// DefaultPercents are the default thresholds: 80, 90 and 100% of the cap.
var DefaultPercents = []int{80, 90, 100}

// MetricName is the counter's name.
const MetricName = "budgetgen_ratelimit_threshold_crossings_total"

// Options for New. The zero value logs to slog.Default, registers nowhere and
// uses DefaultPercents.
type Options struct {
	// Logger receives one Warn event per crossing. Default slog.Default().
	Logger *slog.Logger
	// Registerer gets the counter; nil keeps it unregistered.
	Registerer prometheus.Registerer
	// Percents of the cap, ascending, each in [1, 1000]. Default DefaultPercents.
	Percents []int
	// Sink, when set, is offered every crossing (internal/eventsink POSTs
	// them as CloudEvents). Offer must not block: it runs on the decision path.
	Sink Sink
	// Now dates the crossings given to Sink; default time.Now.
	Now func() time.Time
}

// Sink receives crossings; an implementation queues and never blocks.
type Sink interface {
	Offer(eventsink.Crossing)
}

// Detector finds crossings. Safe for concurrent use.
type Detector struct {
	log      *slog.Logger
	percents []int
	labels   []string
	counter  *prometheus.CounterVec
	sink     Sink
	now      func() time.Time
}

// New builds a Detector and registers its counter.
func New(o Options) (*Detector, error) {
	d := &Detector{log: o.Logger, percents: o.Percents, sink: o.Sink, now: o.Now}
	if d.now == nil {
		d.now = time.Now
	}
	if d.log == nil {
		d.log = slog.Default()
	}
	if len(d.percents) == 0 {
		d.percents = DefaultPercents
	}
	for i, p := range d.percents {
		if p < 1 || p > 1000 || i > 0 && p <= d.percents[i-1] {
			return nil, fmt.Errorf("thresholds: percents must be ascending within [1, 1000], got %v", d.percents)
		}
		d.labels = append(d.labels, strconv.Itoa(p))
	}
	d.counter = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricName,
		Help: "First crossings in a counter window of a share of a principal's cap, by rule, window (hour, day, week, month) and threshold (percent).",
	}, []string{"domain", "rule", "window", "threshold"})
	if o.Registerer != nil {
		if err := o.Registerer.Register(d.counter); err != nil {
			return nil, fmt.Errorf("thresholds: register metric: %w", err)
		}
	}
	return d, nil
}

// Charge is one charged counter as the engine saw it.
type Charge struct {
	Domain, Rule string
	// Principal is for the log event only (never a metric label).
	Principal string
	// Limit is the cap; 0 (a kill switch) has no thresholds.
	Limit uint64
	// Hits were added by this charge; Total is the counter after the add.
	Hits, Total uint64
	// Shadow tells the log reader the rule does not deny yet.
	Shadow bool
	// Window is the counter window's period (hour, day, week, month; "day"
	// when empty) and WindowStart its first instant: a crossing happens once
	// per window.
	Window      string
	WindowStart time.Time
}

// Threshold returns the counter value at which percent of limit is reached
// (rounded up, so 80% of 5 is 4).
func Threshold(limit uint64, percent int) uint64 {
	p := uint64(percent)
	// limit*p may overflow for huge limits; split the product.
	q, r := limit/100, limit%100
	return q*p + (r*p+99)/100
}

// Observe emits an event and a count for every threshold the charge crossed,
// and returns the crossed percents (for tests and callers' own use).
func (d *Detector) Observe(ctx context.Context, c Charge) []int {
	if c.Limit == 0 || c.Hits == 0 || c.Total < c.Hits {
		return nil
	}
	before := c.Total - c.Hits
	if c.Window == "" {
		c.Window = "day"
	}
	var crossed []int
	for i, p := range d.percents {
		t := Threshold(c.Limit, p)
		if before < t && t <= c.Total {
			crossed = append(crossed, p)
			d.counter.WithLabelValues(c.Domain, c.Rule, c.Window, d.labels[i]).Inc()
			d.emit(ctx, c, p)
		}
	}
	return crossed
}

// emit logs one crossing and offers it to the sink.
func (d *Detector) emit(ctx context.Context, c Charge, p int) {
	attrs := []slog.Attr{
		slog.String("event", "budget_threshold"),
		slog.String("domain", c.Domain),
		slog.String("rule", c.Rule),
		slog.String("principal", c.Principal),
		slog.String("window", c.Window),
		slog.Int("threshold_percent", p),
		slog.Uint64("used", c.Total),
		slog.Uint64("cap", c.Limit),
		slog.Bool("shadow", c.Shadow),
	}
	if !c.WindowStart.IsZero() {
		attrs = append(attrs, slog.String("window_start", c.WindowStart.UTC().Format(time.RFC3339)))
	}
	d.log.LogAttrs(ctx, slog.LevelWarn, "budget threshold crossed", attrs...)
	if d.sink == nil {
		return
	}
	at := d.now().UTC()
	cr := eventsink.Crossing{
		Domain: c.Domain, Rule: c.Rule, Principal: c.Principal, ThresholdPercent: p,
		Used: c.Total, Cap: c.Limit, Shadow: c.Shadow, Day: at.Format(time.DateOnly), At: at, Window: c.Window,
	}
	if !c.WindowStart.IsZero() {
		cr.WindowStart = c.WindowStart.UTC().Format(time.RFC3339)
	}
	d.sink.Offer(cr)
}

// Collector exposes the counter for registries built after New.
func (d *Detector) Collector() prometheus.Collector { return d.counter }
