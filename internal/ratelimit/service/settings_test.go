package service

import (
	"io"
	"slices"
	"strconv"
	"testing"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/charge"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/settings"
	"github.com/budgetgen/budgetgen/internal/store/memory"
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
