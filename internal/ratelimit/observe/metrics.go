package observe

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// Metrics records outcomes in the service's Prometheus metrics; it is also
// the charger's charge.Events. A Metrics over a nil *metrics.Metrics records
// nothing.
//
// Series are by budget (metrics.KeyOf): SetConfig creates every series of
// the config at zero and deletes those of rules and budgets that left it, so
// an alert on any of them can fire on a fresh pod and a removed budget stops
// being reported.
type Metrics struct {
	m    *metrics.Metrics
	snap atomic.Pointer[ruleSnapshot]
	seed maphash.Seed

	// mu guards the live series: those of the config (rebuilt by
	// SetConfig) and those created on the fly for request overrides and
	// limits of a config replaced while their request ran.
	mu          sync.Mutex
	rules       map[metrics.RuleKey]*metrics.Rule
	reservation map[metrics.BudgetKey]*metrics.Reservation
}

// ruleSnapshot holds a config's pre-resolved series, by RateLimit.Index.
type ruleSnapshot struct {
	cfg   *config.Config
	rules []*metrics.Rule
	// reserve is nil for a limit whose budget does not reserve; usage nil
	// for a limit that is not a token budget's (or when the gauge is off).
	reserve []*metrics.Reservation
	usage   []*metrics.Top
}

// NewMetrics returns an observer over m (nil: records nothing).
func NewMetrics(m *metrics.Metrics) *Metrics {
	return &Metrics{m: m, seed: maphash.MakeSeed(), rules: map[metrics.RuleKey]*metrics.Rule{}, reservation: map[metrics.BudgetKey]*metrics.Reservation{}}
}

// SetConfig pre-resolves (and so creates at zero) the series of every limit
// of c, and deletes the series no limit of c has any more.
func (o *Metrics) SetConfig(c *config.Config) {
	if o.m == nil || c == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	ls := c.Limits()
	s := &ruleSnapshot{cfg: c, rules: make([]*metrics.Rule, len(ls)), reserve: make([]*metrics.Reservation, len(ls)), usage: make([]*metrics.Top, len(ls))}
	rules := map[metrics.RuleKey]*metrics.Rule{}
	res := map[metrics.BudgetKey]*metrics.Reservation{}
	budgets := map[metrics.BudgetKey]bool{}
	for i, l := range ls {
		if l.Unlimited {
			continue // never reaches an observer (decide.Item.Limit is nil)
		}
		k := metrics.KeyOf(l)
		if rules[k] == nil {
			rules[k] = o.ruleLocked(k)
		}
		s.rules[i] = rules[k]
		b := l.Budget
		if b == nil {
			continue
		}
		bk := metrics.BudgetKeyOf(b)
		if b.Reserve.On() {
			if res[bk] == nil {
				res[bk] = o.reservationLocked(bk)
			}
			s.reserve[i] = res[bk]
		}
		if b.Kind == budgetmap.KindTokens && l.RequestsPerUnit > 0 {
			budgets[bk] = true
			s.usage[i] = o.m.Usage.Tracker(bk)
		}
	}
	o.dropLocked(rules, res)
	o.m.Usage.Retain(budgets)
	o.snap.Store(s)
}

// ruleLocked returns the live series of k, creating them (o.mu held).
func (o *Metrics) ruleLocked(k metrics.RuleKey) *metrics.Rule {
	if r := o.rules[k]; r != nil {
		return r
	}
	r := o.m.ForRule(k)
	o.rules[k] = r
	return r
}

func (o *Metrics) reservationLocked(k metrics.BudgetKey) *metrics.Reservation {
	if r := o.reservation[k]; r != nil {
		return r
	}
	r := o.m.ForReservation(k)
	o.reservation[k] = r
	return r
}

// dropLocked deletes the live series that are not in the new config's
// (request overrides stay: one series per domain), then makes the new
// config's the live ones (o.mu held).
func (o *Metrics) dropLocked(rules map[metrics.RuleKey]*metrics.Rule, res map[metrics.BudgetKey]*metrics.Reservation) {
	for k, r := range o.rules {
		if rules[k] != nil {
			continue
		}
		if k.Rule == metrics.OverrideRule && k.Budget == "" {
			rules[k] = r
			continue
		}
		o.m.DeleteRule(k)
	}
	for k := range o.reservation {
		if res[k] == nil {
			o.m.DeleteReservation(k)
		}
	}
	o.rules, o.reservation = rules, res
}

// series returns the pre-resolved series of l: from the current config's
// snapshot, or (a request override, or a limit of a config replaced while
// the request ran) looked up by labels. Usage is only tracked for the
// current config's limits.
func (o *Metrics) series(l *config.RateLimit) (*metrics.Rule, *metrics.Reservation, *metrics.Top) {
	if s := o.snap.Load(); s != nil && l.Index >= 0 && l.Index < len(s.rules) && s.cfg.Limits()[l.Index] == l {
		return s.rules[l.Index], s.reserve[l.Index], s.usage[l.Index]
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var res *metrics.Reservation
	if b := l.Budget; b != nil && b.Reserve.On() {
		res = o.reservationLocked(metrics.BudgetKeyOf(b))
	}
	return o.ruleLocked(metrics.KeyOf(l)), res, nil
}

// Descriptor implements Observer.
func (o *Metrics) Descriptor(_ context.Context, d *Descriptor) {
	if o.m == nil {
		return
	}
	it := d.Item
	r, res, top := o.series(it.Limit)
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
	if res != nil {
		reservation(res, it)
	}
	if top != nil && !it.Cached && !d.StoreFailed && len(it.Key) > 0 {
		// The key names the principal's counter in this window; only its
		// hash is kept.
		top.Observe(maphash.Bytes(o.seed, it.Key), float64(it.Total)/float64(it.Limit.RequestsPerUnit), it.WindowStart, it.WindowEnd)
	}
}

// reservation counts an item's reservation outcome.
func reservation(res *metrics.Reservation, it *decide.Item) {
	if it.Held {
		res.Holds.Inc()
		res.HeldTokens.Add(float64(it.Reserve))
	}
	if it.ReserveDenied {
		res.Denials.Inc()
	}
	if it.Expired > 0 {
		res.ExpiredTokens.Add(float64(it.Expired))
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

// HoldsExpired implements charge.Events: tokens of l's holds a release
// found expired after its request's call returned (the store's replay of its
// outage buffer) count in ratelimit_reservation_expired_tokens_total as a
// request's own do (reservation), under l's budget.
func (o *Metrics) HoldsExpired(l *config.RateLimit, tokens uint64) {
	if o.m == nil {
		return
	}
	if _, res, _ := o.series(l); res != nil {
		res.ExpiredTokens.Add(float64(tokens))
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
