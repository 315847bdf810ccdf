// Package metrics defines the rate limit service's Prometheus metrics. Labels
// are bounded by configuration (domain, rule, budget, window, mode, gateway,
// outcome), never by request values, so a principal can never create a time
// series (docs/monitoring.md, Metrics).
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a decision, the values of the "outcome" label.
const (
	OutcomeOK              = "ok"
	OutcomeOverLimit       = "over_limit"
	OutcomeShadowOverLimit = "shadow_over_limit"
	OutcomeNearLimit       = "near_limit"
)

// Known label values of the service's fixed-label counters. New creates
// every combination at zero, so a rule alerting on one of them can fire on a
// fresh pod (Prometheus cannot see an increase from a series that does not
// exist yet). Tests check these lists against the constants of the packages
// that produce the values.
var (
	// RequestCodes are ratelimit_requests_total's code values (observe.Request*).
	RequestCodes = []string{"ok", "over_limit", "invalid_argument", "unavailable"}
	// StoreOps are the op values of the store call metrics.
	StoreOps = []string{"charge", "deferred_charge"}
	// StoreErrorReasons are observe.ErrReason's values.
	StoreErrorReasons = []string{"timeout", "unavailable", "malformed_reply", "full", "other"}
	// FailurePolicies are decide.FailurePolicyNames.
	FailurePolicies = []string{"allow", "deny", "error"}
	// ConfigSources name the config sources (source.Files, the xDS client,
	// the budget map).
	ConfigSources = []string{"file", "xds", "budget_map"}
	// ConfigResults are the result values of ratelimit_config_loads_total.
	ConfigResults = []string{"success", "error"}
	// CacheResults are the over-limit cache's result values.
	CacheResults = []string{"hit", "full"}
	// UnsentOutcomes are charge.Unsent* (ratelimit_unsent_hits_total).
	UnsentOutcomes = []string{"deferred", "dropped", "refused", "saturated"}
	// Outcomes are the decision outcomes.
	Outcomes = []string{OutcomeOK, OutcomeOverLimit, OutcomeShadowOverLimit, OutcomeNearLimit}
)

// Metrics are the service's collectors. A nil *Metrics is valid and records
// nothing, so packages can be used without Prometheus.
type Metrics struct {
	Decisions     *prometheus.CounterVec // RuleLabels + outcome
	TokensCharged *prometheus.CounterVec // RuleLabels
	Requests      *prometheus.CounterVec // code: ok, over_limit, invalid_argument, unavailable
	StoreErrors   *prometheus.CounterVec // op: charge|deferred_charge, reason: see StoreErrorReasons
	StoreLatency  *prometheus.HistogramVec
	FailurePolicy *prometheus.CounterVec // policy applied after a store error: allow|deny|error
	ConfigLoads   *prometheus.CounterVec // source, result: success|error
	ConfigRules   prometheus.Gauge
	// ConfigLastLoad is 1 per source whose last load succeeded, 0 after a
	// rejected one, from the first load on (a rejection at startup too,
	// which an increase() of ConfigLoads cannot see: it is in the first
	// sample).
	ConfigLastLoad *prometheus.GaugeVec
	// BudgetMapUnmatched counts the budget map's entries whose domain is in
	// the active config but that no rate limit of it matches: rules that
	// count alone, outside their budget's bucket.
	BudgetMapUnmatched prometheus.Gauge
	OverLimitCache     *prometheus.CounterVec // result: hit|full
	DeferredCharges    prometheus.Counter
	GlobalShadow       prometheus.Counter
	// UnsentHits are hits that were in no store call, by outcome: deferred
	// (handed to the store's outage buffer), dropped, refused, saturated.
	UnsentHits *prometheus.CounterVec
	// Reservation counters, by BudgetLabels (see Reservation).
	ReservationHolds, ReservationHeldTokens, ReservationDenials, ReservationExpiredTokens *prometheus.CounterVec
	// Usage is the gauge of the top principals' usage ratio per budget.
	Usage *Usage

	// Pre-resolved children for the hot path.
	RequestsOK, RequestsOverLimit, CacheHits prometheus.Counter
	ChargeLatency                            prometheus.Observer
}

// Options for NewWith; the zero value takes the defaults.
type Options struct {
	// TopPrincipals is how many principals per budget the usage gauge
	// reports (ratelimit_budget_usage_ratio's rank label); default
	// DefaultTopPrincipals, negative turns the gauge off.
	TopPrincipals int
	// Now tells the usage gauge when a window has ended; default time.Now.
	Now func() time.Time
}

// DefaultTopPrincipals is Options.TopPrincipals' default.
const DefaultTopPrincipals = 5

// MaxTopPrincipals bounds Options.TopPrincipals (series per budget).
const MaxTopPrincipals = 100

// New creates the collectors with the default options and registers them
// with reg (nil: not registered).
func New(reg prometheus.Registerer) *Metrics { return NewWith(reg, Options{}) }

// NewWith creates the collectors and registers them with reg (nil: not
// registered). Every fixed-label counter exists at zero from the start.
func NewWith(reg prometheus.Registerer, o Options) *Metrics {
	m := newCollectors()
	m.Usage = newUsage(o)
	precreate(m)
	m.RequestsOK = m.Requests.WithLabelValues("ok")
	m.RequestsOverLimit = m.Requests.WithLabelValues("over_limit")
	m.CacheHits = m.OverLimitCache.WithLabelValues("hit")
	m.ChargeLatency = m.StoreLatency.WithLabelValues("charge")
	if reg != nil {
		reg.MustRegister(m.Decisions, m.TokensCharged, m.Requests, m.StoreErrors, m.StoreLatency,
			m.FailurePolicy, m.ConfigLoads, m.ConfigRules, m.ConfigLastLoad, m.BudgetMapUnmatched, m.OverLimitCache, m.DeferredCharges, m.GlobalShadow, m.UnsentHits,
			m.ReservationHolds, m.ReservationHeldTokens, m.ReservationDenials, m.ReservationExpiredTokens)
		if m.Usage != nil {
			reg.MustRegister(m.Usage)
		}
	}
	return m
}

func newCollectors() *Metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	return &Metrics{
		Decisions: counter("ratelimit_decisions_total",
			"Descriptor decisions by rule (budget, window, mode, gateway from the budget map; a readable rule name otherwise) and outcome; near_limit is counted in addition to ok.",
			append(RuleLabels[:len(RuleLabels):len(RuleLabels)], "outcome")...),
		TokensCharged: counter("ratelimit_tokens_charged_total", "Hits added to counters (hits_addend: tokens for token budgets), by rule.", RuleLabels...),
		Requests:      counter("ratelimit_requests_total", "ShouldRateLimit calls by result.", "code"),
		StoreErrors:   counter("ratelimit_store_errors_total", "Counter store calls that failed, by operation and reason.", "op", "reason"),
		StoreLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_store_call_seconds",
			Help:    "Latency of counter store calls (one per request or deferred batch).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .015, .02, .05, .1, .5},
		}, []string{"op"}),
		FailurePolicy: counter("ratelimit_failure_policy_total", "Requests answered by the failure policy after a store error.", "policy"),
		ConfigLoads:   counter("ratelimit_config_loads_total", "Config loads by source and result; a failed load keeps the last good config.", "source", "result"),
		ConfigRules: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_config_rules",
			Help: "Rate limits in the active config.",
		}),
		ConfigLastLoad: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_config_last_load_success",
			Help: "1 when the source's last config load succeeded, 0 when it was rejected (the last good config stays in force).",
		}, []string{"source"}),
		BudgetMapUnmatched: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_budget_map_unmatched_entries",
			Help: "Budget map entries whose domain is in the active config but that no rate limit of it matches (their rules count outside the budget's bucket).",
		}),
		OverLimitCache: counter("ratelimit_over_limit_cache_total", "Over-limit cache answers (hit) and inserts that found it full (full).", "result"),
		DeferredCharges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_deferred_charges_total",
			Help: "Hits on locally known over-limit counters charged to the store in background batches.",
		}),
		GlobalShadow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_global_shadow_mode_total",
			Help: "Requests answered OK only because SHADOW_MODE is on.",
		}),
		UnsentHits: counter("ratelimit_unsent_hits_total",
			"Hits that were in no store call, by outcome: deferred (their deadline passed before the call started; handed to the store's outage buffer), dropped (the store cannot defer), refused (the store refused them even alone), saturated (their counter is at the store's maximum).",
			"outcome"),
		ReservationHolds: counter("ratelimit_reservation_holds_total",
			"Checks on a reserving budget admitted holding tokens for their request.", BudgetLabels...),
		ReservationHeldTokens: counter("ratelimit_reservation_held_tokens_total",
			"Tokens held by admitted checks on a reserving budget (the sum of their reserve).", BudgetLabels...),
		ReservationDenials: counter("ratelimit_reservation_denials_total",
			"Checks over their budget only because of other requests' holds (the counter alone was within the cap); shadow ones included (see mode).", BudgetLabels...),
		ReservationExpiredTokens: counter("ratelimit_reservation_expired_tokens_total",
			"Tokens of holds released because they expired before their request's charge came.", BudgetLabels...),
	}
}

// precreate creates every fixed-label series at zero.
func precreate(m *Metrics) {
	for _, c := range RequestCodes {
		m.Requests.WithLabelValues(c)
	}
	for _, op := range StoreOps {
		m.StoreLatency.WithLabelValues(op)
		for _, r := range StoreErrorReasons {
			m.StoreErrors.WithLabelValues(op, r)
		}
	}
	for _, p := range FailurePolicies {
		m.FailurePolicy.WithLabelValues(p)
	}
	for _, s := range ConfigSources {
		for _, r := range ConfigResults {
			m.ConfigLoads.WithLabelValues(s, r)
		}
	}
	for _, r := range CacheResults {
		m.OverLimitCache.WithLabelValues(r)
	}
	for _, o := range UnsentOutcomes {
		m.UnsentHits.WithLabelValues(o)
	}
}

// ConfigLoaded counts a config load attempt.
func (m *Metrics) ConfigLoaded(source string, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.ConfigLoads.WithLabelValues(source, "error").Inc()
		m.ConfigLastLoad.WithLabelValues(source).Set(0)
		return
	}
	m.ConfigLoads.WithLabelValues(source, "success").Inc()
	m.ConfigLastLoad.WithLabelValues(source).Set(1)
}

// ConfigInstalled sets the rules gauge to the limits of the config just
// installed (all sources merged). The caller holds the lock it installs
// under, so two loads at once cannot leave the gauge at the older count.
func (m *Metrics) ConfigInstalled(rules int) {
	if m == nil {
		return
	}
	m.ConfigRules.Set(float64(rules))
}

// BudgetMapUnmatchedEntries sets the gauge of budget map entries no rate
// limit of the active config matches. The caller holds the lock it
// installs under, as for ConfigInstalled.
func (m *Metrics) BudgetMapUnmatchedEntries(n int) {
	if m == nil {
		return
	}
	m.BudgetMapUnmatched.Set(float64(n))
}

// Rule holds one rule's pre-resolved counters so the hot path does no label
// lookups.
type Rule struct {
	OK, OverLimit, ShadowOverLimit, NearLimit, Tokens prometheus.Counter
}

// ForRule resolves (and so creates at zero) a rule's counters; nil when m is
// nil.
func (m *Metrics) ForRule(l RuleKey) *Rule {
	if m == nil {
		return nil
	}
	v := l.values()
	with := func(outcome string) prometheus.Counter {
		return m.Decisions.WithLabelValues(append(v[:len(v):len(v)], outcome)...)
	}
	return &Rule{
		OK:              with(OutcomeOK),
		OverLimit:       with(OutcomeOverLimit),
		ShadowOverLimit: with(OutcomeShadowOverLimit),
		NearLimit:       with(OutcomeNearLimit),
		Tokens:          m.TokensCharged.WithLabelValues(v...),
	}
}

// Decision returns the decision counter of a rule and outcome (tests and
// tools; the hot path uses ForRule).
func (m *Metrics) Decision(l RuleKey, outcome string) prometheus.Counter {
	return m.Decisions.WithLabelValues(append(l.values(), outcome)...)
}

// DeleteRule removes a rule's series (its rule left the config).
func (m *Metrics) DeleteRule(l RuleKey) {
	if m == nil {
		return
	}
	v := l.values()
	for _, o := range Outcomes {
		m.Decisions.DeleteLabelValues(append(v[:len(v):len(v)], o)...)
	}
	m.TokensCharged.DeleteLabelValues(v...)
}

// Reservation holds one budget's pre-resolved reservation counters.
type Reservation struct {
	Holds, HeldTokens, Denials, ExpiredTokens prometheus.Counter
}

// ForReservation resolves (and so creates at zero) a budget's reservation
// counters; nil when m is nil.
func (m *Metrics) ForReservation(b BudgetKey) *Reservation {
	if m == nil {
		return nil
	}
	v := b.values()
	return &Reservation{
		Holds:         m.ReservationHolds.WithLabelValues(v...),
		HeldTokens:    m.ReservationHeldTokens.WithLabelValues(v...),
		Denials:       m.ReservationDenials.WithLabelValues(v...),
		ExpiredTokens: m.ReservationExpiredTokens.WithLabelValues(v...),
	}
}

// DeleteReservation removes a budget's reservation series.
func (m *Metrics) DeleteReservation(b BudgetKey) {
	if m == nil {
		return
	}
	v := b.values()
	for _, c := range []*prometheus.CounterVec{m.ReservationHolds, m.ReservationHeldTokens, m.ReservationDenials, m.ReservationExpiredTokens} {
		c.DeleteLabelValues(v...)
	}
}
