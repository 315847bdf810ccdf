// Package metrics defines the rate limit service's Prometheus metrics. Labels
// are bounded by configuration (domain, rule, outcome), never by request
// values, so a principal can never create a time series.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a decision, the values of the "outcome" label.
const (
	OutcomeOK              = "ok"
	OutcomeOverLimit       = "over_limit"
	OutcomeShadowOverLimit = "shadow_over_limit"
	OutcomeNearLimit       = "near_limit"
)

// Metrics are the service's collectors. A nil *Metrics is valid and records
// nothing, so packages can be used without Prometheus.
type Metrics struct {
	Decisions       *prometheus.CounterVec // domain, rule, outcome
	TokensCharged   *prometheus.CounterVec // domain, rule
	Requests        *prometheus.CounterVec // code: ok, over_limit, invalid_argument, unavailable
	StoreErrors     *prometheus.CounterVec // op: charge|deferred_charge, reason: timeout|unavailable|other
	StoreLatency    *prometheus.HistogramVec
	FailurePolicy   *prometheus.CounterVec // policy applied after a store error: allow|deny|error
	ConfigLoads     *prometheus.CounterVec // source, result: success|error
	ConfigRules     prometheus.Gauge
	OverLimitCache  *prometheus.CounterVec // result: hit|miss|insert|full
	DeferredCharges prometheus.Counter
	GlobalShadow    prometheus.Counter
	// UnsentHits are hits that were in no store call, by outcome: deferred
	// (handed to the store's outage buffer), dropped, caller_gone, refused.
	UnsentHits *prometheus.CounterVec

	// Pre-resolved children for the hot path.
	RequestsOK, RequestsOverLimit, CacheHits prometheus.Counter
	ChargeLatency                            prometheus.Observer
}

// New creates the collectors and registers them with reg (nil: not registered).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_decisions_total",
			Help: "Descriptor decisions by domain, rule (config path) and outcome; near_limit is counted in addition to ok.",
		}, []string{"domain", "rule", "outcome"}),
		TokensCharged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_tokens_charged_total",
			Help: "Hits added to counters (hits_addend), by domain and rule.",
		}, []string{"domain", "rule"}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_requests_total",
			Help: "ShouldRateLimit calls by result.",
		}, []string{"code"}),
		StoreErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_store_errors_total",
			Help: "Counter store calls that failed.",
		}, []string{"op", "reason"}),
		StoreLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ratelimit_store_call_seconds",
			Help:    "Latency of counter store calls (one per request or deferred batch).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .015, .02, .05, .1, .5},
		}, []string{"op"}),
		FailurePolicy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_failure_policy_total",
			Help: "Requests answered by the failure policy after a store error.",
		}, []string{"policy"}),
		ConfigLoads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_config_loads_total",
			Help: "Config loads by source and result; a failed load keeps the last good config.",
		}, []string{"source", "result"}),
		ConfigRules: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_config_rules",
			Help: "Rate limits in the active config.",
		}),
		OverLimitCache: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_over_limit_cache_total",
			Help: "Local over-limit cache lookups and inserts.",
		}, []string{"result"}),
		DeferredCharges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_deferred_charges_total",
			Help: "Hits on locally known over-limit counters charged to the store in background batches.",
		}),
		GlobalShadow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_global_shadow_mode_total",
			Help: "Requests answered OK only because SHADOW_MODE is on.",
		}),
		UnsentHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_unsent_hits_total",
			Help: "Hits that were in no store call, by outcome: deferred (their deadline passed before the call started; handed to the store's outage buffer), dropped (the store cannot defer), caller_gone (the caller cancelled first), refused (the store refused them even alone).",
		}, []string{"outcome"}),
	}
	m.RequestsOK = m.Requests.WithLabelValues("ok")
	m.RequestsOverLimit = m.Requests.WithLabelValues("over_limit")
	m.CacheHits = m.OverLimitCache.WithLabelValues("hit")
	m.ChargeLatency = m.StoreLatency.WithLabelValues("charge")
	if reg != nil {
		reg.MustRegister(m.Decisions, m.TokensCharged, m.Requests, m.StoreErrors, m.StoreLatency,
			m.FailurePolicy, m.ConfigLoads, m.ConfigRules, m.OverLimitCache, m.DeferredCharges, m.GlobalShadow, m.UnsentHits)
	}
	return m
}

// ConfigLoaded records a config load attempt.
func (m *Metrics) ConfigLoaded(source string, err error, rules int) {
	if m == nil {
		return
	}
	if err != nil {
		m.ConfigLoads.WithLabelValues(source, "error").Inc()
		return
	}
	m.ConfigLoads.WithLabelValues(source, "success").Inc()
	m.ConfigRules.Set(float64(rules))
}

// Rule holds one rule's pre-resolved counters so the hot path does no label
// lookups.
type Rule struct {
	OK, OverLimit, ShadowOverLimit, NearLimit, Tokens prometheus.Counter
}

// ForRule resolves a rule's counters; nil when m is nil.
func (m *Metrics) ForRule(domain, rule string) *Rule {
	if m == nil {
		return nil
	}
	return &Rule{
		OK:              m.Decisions.WithLabelValues(domain, rule, OutcomeOK),
		OverLimit:       m.Decisions.WithLabelValues(domain, rule, OutcomeOverLimit),
		ShadowOverLimit: m.Decisions.WithLabelValues(domain, rule, OutcomeShadowOverLimit),
		NearLimit:       m.Decisions.WithLabelValues(domain, rule, OutcomeNearLimit),
		Tokens:          m.TokensCharged.WithLabelValues(domain, rule),
	}
}
