// Package storemetrics exports a counter store's own bookkeeping (outage
// buffer, lost, expired, canceled and ambiguous hits, capacity) as Prometheus
// metrics read at scrape time, so every outcome class of a charge can be
// checked from outside (docs/architecture.md, Accounting).
package storemetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/memory"
	"github.com/budgetgen/budgetgen/internal/store/valkey"
)

// Register exports st's counters on reg (a store of another type exports
// nothing).
func Register(reg prometheus.Registerer, st store.Store) {
	counter := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
	}
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}
	switch s := st.(type) {
	case *valkey.Store:
		gauge("ratelimit_valkey_in_flight_calls", "Store calls holding a Valkey slot now.", func() float64 { return float64(s.Stats().InFlight) })
		gauge("ratelimit_valkey_buffer_keys", "Counters and ledger fields waiting in the outage buffer.", func() float64 { return float64(s.Stats().BufferKeys) })
		gauge("ratelimit_valkey_buffer_bytes", "Bytes the outage buffer's entries count against its bound: the keys and ledger fields they hold plus about 184 bytes each (about their live heap).", func() float64 { return float64(s.Stats().BufferBytes) })
		gauge("ratelimit_valkey_buffer_max_bytes", "The outage buffer's bound in bytes (VALKEY_BUFFER_MAX_BYTES); beyond it, as beyond 100,000 entries, charges are counted lost.", func() float64 { return float64(s.Stats().BufferMaxBytes) })
		counter("ratelimit_valkey_no_slot_total", "Store calls not sent: no free slot before their deadline, or Valkey stalled.", func() float64 { return float64(s.Stats().NoSlot) })
		counter("ratelimit_valkey_not_connected_calls_total", "Store calls not sent because the store had not yet connected to Valkey since start (buffered).", func() float64 { return float64(s.Stats().NotConnected) })
		counter("ratelimit_valkey_stalled_calls_total", "Store calls not sent because Valkey had answered nothing for 100 ms with calls in flight (buffered, not sent into the stall).", func() float64 { return float64(s.Stats().Stalled) })
		counter("ratelimit_valkey_buffered_hits_total", "Hits kept in the outage buffer because Valkey certainly did not get them.", func() float64 { return float64(s.Stats().Buffered) })
		counter("ratelimit_valkey_replayed_hits_total", "Buffered hits applied once Valkey answered again.", func() float64 { return float64(s.Stats().Replayed) })
		counter("ratelimit_valkey_lost_hits_total", "Hits dropped because the outage buffer was full or disabled.", func() float64 { return float64(s.Stats().Lost) })
		counter("ratelimit_valkey_expired_hits_total", "Buffered hits dropped because their window ended first.", func() float64 { return float64(s.Stats().Expired) })
		counter("ratelimit_valkey_ambiguous_hits_total", "Hits sent but unanswered (maybe applied): replayed under their call id, applied at most once.", func() float64 { return float64(s.Stats().Ambiguous) })
		counter("ratelimit_valkey_ambiguous_applied_hits_total", "Ambiguous hits whose replay found them already applied.", func() float64 { return float64(s.Stats().AmbiguousApplied) })
		counter("ratelimit_valkey_ambiguous_replayed_hits_total", "Ambiguous hits applied by their replay.", func() float64 { return float64(s.Stats().AmbiguousReplayed) })
		counter("ratelimit_valkey_ambiguous_dropped_hits_total", "Ambiguous hits given up (maybe applied): id window passed, buffer full or store closed.", func() float64 { return float64(s.Stats().AmbiguousDropped) })
		counter("ratelimit_valkey_canceled_hits_total", "Hits of calls whose deadline had passed when they reached the store: not sent; handed back to the charger, which defers them (counted in ratelimit_unsent_hits_total{outcome=\"deferred\"} and buffered).", func() float64 { return float64(s.Stats().Canceled) })
		counter("ratelimit_valkey_applied_on_error_hits_total", "Hits Valkey applied in calls that returned an error to the engine.", func() float64 { return float64(s.Stats().AppliedOnError) })
		ledger(counter, s)
		releases(counter, s)
	case *memory.Store:
		gauge("ratelimit_memory_counters", "Live counters in the embedded memory store.", func() float64 { return float64(s.Stats().Counters) })
		gauge("ratelimit_memory_bytes", "What the embedded memory store's live counters count against MEMORY_MAX_BYTES: their keys plus about 128 bytes each (about their live heap).", func() float64 { return float64(s.Stats().Bytes) })
		gauge("ratelimit_memory_max_bytes", "The embedded memory store's bound in bytes (MEMORY_MAX_BYTES); at it, as at MEMORY_MAX_COUNTERS, calls needing a new counter are refused.", func() float64 { return float64(s.Stats().MaxBytes) })
		counter("ratelimit_memory_refused_total", "Calls refused because the memory store was full, at MEMORY_MAX_COUNTERS or MEMORY_MAX_BYTES (answered by MEMORY_FULL_POLICY).", func() float64 { return float64(s.Stats().Refused) })
		counter("ratelimit_memory_evicted_total", "Counters of ended windows (in their grace period) reclaimed to make room at MEMORY_MAX_COUNTERS.", func() float64 { return float64(s.Stats().Evicted) })
	}
}

// ledger exports the Valkey store's classes of the shadow-week ledger's
// increments (store.Counter.Ledger: a charge's hits, also added to its
// ledger hash), every class the hits have, in tokens.
func ledger(counter func(name, help string, f func() float64), s *valkey.Store) {
	for _, c := range []struct {
		name, help string
		f          func(valkey.Stats) uint64
	}{
		{"ratelimit_valkey_ledger_buffered_tokens_total", "Ledger (usage report) increments kept in the outage buffer.",
			func(st valkey.Stats) uint64 { return st.LedgerBuffered }},
		{"ratelimit_valkey_ledger_replayed_tokens_total", "Buffered ledger increments applied once Valkey answered again.",
			func(st valkey.Stats) uint64 { return st.LedgerReplayed }},
		{"ratelimit_valkey_ledger_lost_tokens_total", "Ledger increments dropped (buffer full, wrong key type, closed).",
			func(st valkey.Stats) uint64 { return st.LedgerLost }},
		{"ratelimit_valkey_ledger_expired_tokens_total", "Buffered ledger increments dropped because the counter they were charged with expired first (its window's end plus EXPIRATION_JITTER_MAX_SECONDS), though the ledger hash itself is kept for LEDGER_RETENTION_DAYS.",
			func(st valkey.Stats) uint64 { return st.LedgerExpired }},
		{"ratelimit_valkey_ledger_ambiguous_tokens_total", "Ledger increments sent but unanswered (maybe applied): replayed with their charge under its call id, applied at most once; missing from the ledger only if given up (id window passed, buffer full or store closed).",
			func(st valkey.Stats) uint64 { return st.LedgerAmbiguous }},
		{"ratelimit_valkey_ledger_ambiguous_applied_tokens_total", "Ambiguous ledger increments whose replay found them already applied.",
			func(st valkey.Stats) uint64 { return st.LedgerAmbiguousApplied }},
		{"ratelimit_valkey_ledger_ambiguous_replayed_tokens_total", "Ambiguous ledger increments applied by their replay.",
			func(st valkey.Stats) uint64 { return st.LedgerAmbiguousReplayed }},
		{"ratelimit_valkey_ledger_ambiguous_dropped_tokens_total", "Ambiguous ledger increments given up (maybe applied, maybe missing from the ledger): id window passed, buffer full or store closed.",
			func(st valkey.Stats) uint64 { return st.LedgerAmbiguousDropped }},
		{"ratelimit_valkey_ledger_canceled_tokens_total", "Ledger increments of calls whose deadline had passed when they reached the store: not sent; handed back with their hits, which the charger defers (then counted buffered).",
			func(st valkey.Stats) uint64 { return st.LedgerCanceled }},
		{"ratelimit_valkey_ledger_applied_on_error_tokens_total", "Ledger increments Valkey applied in calls that returned an error to the engine.",
			func(st valkey.Stats) uint64 { return st.LedgerAppliedOnError }},
	} {
		counter(c.name, c.help, func() float64 { return float64(c.f(s.Stats())) })
	}
}

// releases exports the Valkey store's classes of hold releases (a reserving
// budget's charge releases one hold of its counter), as the hits' and the
// ledger's are exported. A release lost, expired or given up leaves its hold
// until the hold expires (RESERVATION_EXPIRY): the budget reads tighter, it
// is never overspent.
func releases(counter func(name, help string, f func() float64), s *valkey.Store) {
	for _, c := range []struct {
		name, help string
		f          func(valkey.Stats) uint64
	}{
		{"ratelimit_valkey_buffered_releases_total", "Hold releases (a reserving budget's charges) kept in the outage buffer because Valkey certainly did not get them.",
			func(st valkey.Stats) uint64 { return st.ReleaseBuffered }},
		{"ratelimit_valkey_replayed_releases_total", "Buffered hold releases applied once Valkey answered again.",
			func(st valkey.Stats) uint64 { return st.ReleaseReplayed }},
		{"ratelimit_valkey_lost_releases_total", "Hold releases dropped because the outage buffer was full or disabled, or the store closed: their holds stay until they expire.",
			func(st valkey.Stats) uint64 { return st.ReleaseLost }},
		{"ratelimit_valkey_expired_releases_total", "Buffered hold releases dropped because their holds had certainly expired (RESERVATION_EXPIRY after the charge) or their counter's window had ended before Valkey answered again: replayed, a release would free another request's hold.",
			func(st valkey.Stats) uint64 { return st.ReleaseExpired }},
		{"ratelimit_valkey_ambiguous_releases_total", "Hold releases sent but unanswered (maybe applied): replayed under their call id, applied at most once.",
			func(st valkey.Stats) uint64 { return st.ReleaseAmbiguous }},
		{"ratelimit_valkey_ambiguous_applied_releases_total", "Ambiguous hold releases whose replay found them already applied.",
			func(st valkey.Stats) uint64 { return st.ReleaseAmbiguousApplied }},
		{"ratelimit_valkey_ambiguous_replayed_releases_total", "Ambiguous hold releases applied by their replay.",
			func(st valkey.Stats) uint64 { return st.ReleaseAmbiguousReplayed }},
		{"ratelimit_valkey_ambiguous_dropped_releases_total", "Ambiguous hold releases given up (maybe applied): id window passed, their holds certainly expired, buffer full or store closed.",
			func(st valkey.Stats) uint64 { return st.ReleaseAmbiguousDropped }},
		{"ratelimit_valkey_canceled_releases_total", "Hold releases of calls whose deadline had passed when they reached the store: not sent; handed back with their hits, which the charger defers (then counted buffered).",
			func(st valkey.Stats) uint64 { return st.ReleaseCanceled }},
		{"ratelimit_valkey_applied_on_error_releases_total", "Hold releases Valkey applied in calls that returned an error to the engine.",
			func(st valkey.Stats) uint64 { return st.ReleaseAppliedOnError }},
	} {
		counter(c.name, c.help, func() float64 { return float64(c.f(s.Stats())) })
	}
}

// RegisterSnapshot exports the embedded store's snapshot writes on reg: when
// the last one succeeded and its size, and the failures (while writes fail,
// a crash loses everything since the last success, not one interval).
func RegisterSnapshot(reg prometheus.Registerer, sn *memory.Snapshotter) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ratelimit_memory_snapshot_last_success_timestamp_seconds",
			Help: "Unix time of the last successful write of the embedded store's snapshot (MEMORY_SNAPSHOT_PATH); 0 before the first."},
			func() float64 {
				if t := sn.Stats().LastWritten; !t.IsZero() {
					return float64(t.UnixNano()) / 1e9
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ratelimit_memory_snapshot_bytes", Help: "Size of the last snapshot written."},
			func() float64 { return float64(sn.Stats().Bytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ratelimit_memory_snapshot_failures_total",
			Help: "Failed snapshot writes (the previous snapshot is kept; a crash loses everything charged since the last success)."},
			func() float64 { return float64(sn.Stats().Failures) }),
	)
}
