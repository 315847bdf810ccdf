package service

import (
	"io"
	"log/slog"
	"slices"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/charge"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/settings"
	"github.com/budgetgen/budgetgen/internal/store/memory"
	"github.com/budgetgen/budgetgen/internal/store/valkey"
)

// TestSettingsAgreeWithComponents: settings import no component, so the
// defaults and bounds they copy from one are checked here, where both meet:
// an unset setting gives the component its own default, and a value the
// component refuses is refused at start, with the setting's name.
func TestSettingsAgreeWithComponents(t *testing.T) {
	d := settings.Defaults()
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"STORE_BATCH_WORKERS", d.StoreBatchWorkers, charge.DefaultBatchWorkers},
		{"STORE_TIMEOUT", d.StoreTimeout, charge.DefaultStoreTimeout},
		{"OVER_LIMIT_CACHE_SIZE", d.OverLimitCacheSize, charge.DefaultOverLimitCacheSize},
		{"RESERVATION_EXPIRY", d.ReservationExpiry, charge.DefaultHoldExpiry},
		{"EXPIRATION_JITTER_MAX_SECONDS", d.Grace, charge.DefaultGrace},
		{"NEAR_LIMIT_RATIO", d.NearLimitRatio, float32(decide.DefaultNearLimitRatio)},
		{"FAILURE_POLICY", d.FailurePolicy, decide.FailAllow},
		{"BUDGET_USAGE_TOP_PRINCIPALS", d.BudgetUsageTopPrincipals, metrics.DefaultTopPrincipals},
		{"LEDGER_RETENTION_DAYS", d.LedgerRetentionDays, ledger.DefaultRetentionDays},
		{"MEMORY_SNAPSHOT_INTERVAL", d.MemorySnapshotInterval, memory.DefaultSnapshotInterval},
		{"MEMORY_FULL_POLICY", memoryFullPolicy(d.MemoryFullPolicy), memory.FullDeny},
		{"VALKEY_BUFFER_MAX_BYTES's documented default", settings.DefaultBufferMaxBytes, valkey.DefaultBufferMaxBytes},
	} {
		if c.got != c.want {
			t.Errorf("%s: settings default %v, the component's %v", c.name, c.got, c.want)
		}
	}
	if !slices.Equal(settings.MemoryFullPolicyNames, memory.FullPolicyNames) {
		t.Errorf("MEMORY_FULL_POLICY names %q, the memory store's %q", settings.MemoryFullPolicyNames, memory.FullPolicyNames)
	}
	for i, name := range settings.MemoryFullPolicyNames {
		if got := memoryFullPolicy(settings.MemoryFullPolicy(i)); got.String() != name {
			t.Errorf("MEMORY_FULL_POLICY=%s maps to the memory store's %s", name, got)
		}
	}

	// The bounds: every value one side refuses, the other refuses too.
	load := func(name string, v int) error {
		_, err := settings.Load(nil, func(k string) string {
			if k == name {
				return strconv.Itoa(v)
			}
			return ""
		}, io.Discard)
		return err
	}
	for _, days := range []int{ledger.MinRetentionDays - 1, ledger.MinRetentionDays, ledger.MaxRetentionDays, ledger.MaxRetentionDays + 1} {
		ledgerErr := (&ledger.Options{RetentionDays: days}).Validate()
		if err := load("LEDGER_RETENTION_DAYS", days); (err == nil) != (ledgerErr == nil) {
			t.Errorf("LEDGER_RETENTION_DAYS=%d: settings say %v, the ledger %v", days, err, ledgerErr)
		}
	}
	for _, n := range []int{metrics.MaxTopPrincipals, metrics.MaxTopPrincipals + 1} {
		if err := load("BUDGET_USAGE_TOP_PRINCIPALS", n); (err == nil) != (n <= metrics.MaxTopPrincipals) {
			t.Errorf("BUDGET_USAGE_TOP_PRINCIPALS=%d (metrics.MaxTopPrincipals %d): %v", n, metrics.MaxTopPrincipals, err)
		}
	}
}

// TestValkeyBufferMaxBytesReachesTheStore: VALKEY_BUFFER_MAX_BYTES is the
// Valkey store's BufferMaxBytes (read back through its Stats, which
// ratelimit_valkey_buffer_max_bytes exports); unset, the store keeps its
// default.
func TestValkeyBufferMaxBytesReachesTheStore(t *testing.T) {
	for _, tc := range []struct {
		set  string
		want int64
	}{{"", valkey.DefaultBufferMaxBytes}, {"2097152", 2 << 20}} {
		env := map[string]string{"REDIS_URL": "127.0.0.1:1", "VALKEY_BUFFER_MAX_BYTES": tc.set} // nothing listens: connects in the background
		s, err := settings.Load(nil, func(k string) string { return env[k] }, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		st, _, _, err := openStore(s, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		got := st.(*valkey.Store).Stats().BufferMaxBytes
		_ = st.Close()
		if got != tc.want {
			t.Errorf("VALKEY_BUFFER_MAX_BYTES=%q: the store's bound is %d, want %d", tc.set, got, tc.want)
		}
	}
}

// TestEmbeddedByteBoundFollowsTheMemoryLimit: MEMORY_MAX_BYTES is the
// embedded store's MaxBytes (read back through its Stats, which
// ratelimit_memory_max_bytes exports); unset, the bound is half the Go soft
// memory limit set from the container's (a 256 MiB pod must refuse new
// counters before it is OOM-killed), or the documented default where that
// is larger or unknown.
func TestEmbeddedByteBoundFollowsTheMemoryLimit(t *testing.T) {
	if settings.DefaultMemoryMaxBytes != memory.DefaultMaxBytes {
		t.Errorf("MEMORY_MAX_BYTES's documented default %d, the store's %d", settings.DefaultMemoryMaxBytes, memory.DefaultMaxBytes)
	}
	for _, tc := range []struct {
		set       string
		softLimit int64
		want      int64
	}{
		{"", 0, memory.DefaultMaxBytes},
		{"", 230 << 20, 115 << 20},
		{"", 4 << 30, memory.DefaultMaxBytes},
		{"2097152", 0, 2 << 20},
		{"2097152", 230 << 20, 2 << 20},
	} {
		env := map[string]string{"MEMORY_MAX_BYTES": tc.set, "MEMORY_SNAPSHOT_PATH": "off"}
		s, err := settings.Load(nil, func(k string) string { return env[k] }, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		quiet := slog.New(slog.DiscardHandler)
		r := &runner{s: s, log: quiet, startup: quiet, reg: prometheus.NewRegistry(), softLimit: tc.softLimit}
		st, err := r.startStore()
		if err != nil {
			t.Fatal(err)
		}
		got := st.st.(*memory.Store).Stats().MaxBytes
		r.stop.run()
		if got != tc.want {
			t.Errorf("MEMORY_MAX_BYTES=%q, soft limit %d: the store's bound is %d, want %d", tc.set, tc.softLimit, got, tc.want)
		}
	}
}
