package observe

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/store"
)

// Metrics records outcomes in the service's Prometheus metrics; it is also
// the charger's charge.Events. A Metrics over a nil *metrics.Metrics records
// nothing.
type Metrics struct {
	m    *metrics.Metrics
	snap atomic.Pointer[ruleSnapshot]

	overrideMu    sync.Mutex
	overrideRules map[string]*metrics.Rule
}

type ruleSnapshot struct {
	cfg   *config.Config
	rules []*metrics.Rule // by RateLimit.Index
}

// NewMetrics returns an observer over m (nil: records nothing).
func NewMetrics(m *metrics.Metrics) *Metrics {
	return &Metrics{m: m, overrideRules: map[string]*metrics.Rule{}}
}

// SetConfig pre-resolves the per-rule series of c.
func (o *Metrics) SetConfig(c *config.Config) {
	if o.m == nil || c == nil {
		return
	}
	s := &ruleSnapshot{cfg: c, rules: make([]*metrics.Rule, len(c.Limits()))}
	for i, l := range c.Limits() {
		s.rules[i] = o.m.ForRule(l.Domain, l.Rule)
	}
	o.snap.Store(s)
}

func (o *Metrics) rule(l *config.RateLimit) *metrics.Rule {
	if s := o.snap.Load(); s != nil && l.Index >= 0 && l.Index < len(s.rules) && s.cfg.Limits()[l.Index] == l {
		return s.rules[l.Index]
	}
	// A request-supplied limit override (one series per domain), or a limit
	// of a config replaced while the request ran.
	o.overrideMu.Lock()
	defer o.overrideMu.Unlock()
	k := l.Domain + "\x00" + l.Rule
	r := o.overrideRules[k]
	if r == nil {
		r = o.m.ForRule(l.Domain, l.Rule)
		o.overrideRules[k] = r
	}
	return r
}

// Descriptor implements Observer.
func (o *Metrics) Descriptor(_ context.Context, d *Descriptor) {
	if o.m == nil {
		return
	}
	it := d.Item
	r := o.rule(it.Limit)
	if it.Hits > 0 {
		r.Tokens.Add(float64(it.Hits))
	}
	switch {
	case it.Over && it.Limit.ShadowMode:
		r.ShadowOverLimit.Inc()
	case it.Over:
		r.OverLimit.Inc()
	default:
		r.OK.Inc()
		if it.Near {
			r.NearLimit.Inc()
		}
	}
}

// Request implements Observer.
func (o *Metrics) Request(_ context.Context, r *Request) {
	m := o.m
	if m == nil {
		return
	}
	if r.FailurePolicy != "" {
		m.FailurePolicy.WithLabelValues(r.FailurePolicy).Inc()
	}
	if r.GlobalShadowed {
		m.GlobalShadow.Inc()
	}
	switch r.Class {
	case RequestOK:
		m.RequestsOK.Inc()
	case RequestOverLimit:
		m.RequestsOverLimit.Inc()
	default:
		m.Requests.WithLabelValues(r.Class).Inc()
	}
}

// CacheHit implements charge.Events.
func (o *Metrics) CacheHit() {
	if o.m != nil {
		o.m.CacheHits.Inc()
	}
}

// CacheFull implements charge.Events.
func (o *Metrics) CacheFull() {
	if o.m != nil {
		o.m.OverLimitCache.WithLabelValues("full").Inc()
	}
}

// Charged implements charge.Events.
func (o *Metrics) Charged(took time.Duration, err error) {
	if o.m == nil {
		return
	}
	o.m.ChargeLatency.Observe(took.Seconds())
	if err != nil {
		o.m.StoreErrors.WithLabelValues("charge", ErrReason(err)).Inc()
	}
}

// Flushed implements charge.Events.
func (o *Metrics) Flushed(hits uint64, took time.Duration, err error) {
	if o.m == nil {
		return
	}
	o.m.StoreLatency.WithLabelValues("deferred_charge").Observe(took.Seconds())
	if err != nil {
		o.m.StoreErrors.WithLabelValues("deferred_charge", ErrReason(err)).Inc()
		return
	}
	o.m.DeferredCharges.Add(float64(hits))
}

// Unsent implements charge.Events.
func (o *Metrics) Unsent(class string, hits uint64) {
	if o.m != nil {
		o.m.UnsentHits.WithLabelValues(class).Add(float64(hits))
	}
}

// ErrReason is the reason label of a store error.
func ErrReason(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, store.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, store.ErrMalformedReply):
		return "malformed_reply"
	case errors.Is(err, store.ErrFull):
		return "full"
	}
	return "other"
}
