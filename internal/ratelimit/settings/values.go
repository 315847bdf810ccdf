package settings

import (
	"fmt"
	"time"
)

// Settings are plain values: this package imports no component (engine,
// charge, the stores, ledger, metrics, observers). The composition root
// (internal/ratelimit/service) turns them into components. The defaults
// below are those components' own, copied so they need no import;
// TestSettingsAgreeWithComponents (internal/ratelimit/service) fails when a
// copy and its component disagree, and TestSettingsImportNoComponent
// (internal/ratelimit/layering) when an import comes back.
const (
	// defaultStoreBatchWorkers is charge.DefaultBatchWorkers.
	defaultStoreBatchWorkers = 4
	// defaultStoreTimeout is charge.DefaultStoreTimeout: below Envoy
	// Gateway's 20 ms RLS timeout, so the failure policy answers first.
	defaultStoreTimeout = 15 * time.Millisecond
	// defaultOverLimitCacheSize is charge.DefaultOverLimitCacheSize.
	defaultOverLimitCacheSize = 100_000
	// defaultReservationExpiry is charge.DefaultHoldExpiry.
	defaultReservationExpiry = 10 * time.Minute
	// defaultTopPrincipals and maxTopPrincipals are metrics.DefaultTopPrincipals
	// and metrics.MaxTopPrincipals.
	defaultTopPrincipals = 5
	maxTopPrincipals     = 100
	// defaultRetentionDays, minRetentionDays and maxRetentionDays are
	// ledger.DefaultRetentionDays, MinRetentionDays and MaxRetentionDays.
	defaultRetentionDays = 10
	minRetentionDays     = 8
	maxRetentionDays     = 92
	// defaultSnapshotInterval is memory.DefaultSnapshotInterval.
	defaultSnapshotInterval = 10 * time.Second
)

// VALKEY_BUFFER_MAX_BYTES: 0 keeps DefaultBufferMaxBytes, the Valkey store's
// own default (valkey.DefaultBufferMaxBytes), which its doc names; a value
// is within [MinBufferMaxBytes, MaxBufferMaxBytes]: below 1 MiB the buffer
// keeps a few thousand short keys at most, above 4 GiB it no longer keeps a
// pod from being OOM-killed with everything it buffered.
const (
	DefaultBufferMaxBytes = 64 << 20
	MinBufferMaxBytes     = 1 << 20
	MaxBufferMaxBytes     = 4 << 30
)

// DefaultMemoryMaxBytes is MEMORY_MAX_BYTES when 0: the embedded store's own
// default (memory.DefaultMaxBytes, 256 MiB), which its doc names.
const DefaultMemoryMaxBytes = 256 << 20

// MemoryFullPolicy is MEMORY_FULL_POLICY: what a request needing a new
// counter gets when the embedded store is at MEMORY_MAX_COUNTERS or
// MEMORY_MAX_BYTES. The
// service maps it to memory.FullPolicy, whose names these are.
type MemoryFullPolicy uint8

// The memory full policies.
const (
	// MemoryFullDeny answers OVER_LIMIT whatever FAILURE_POLICY: the bound
	// still enforces (the default).
	MemoryFullDeny MemoryFullPolicy = iota
	// MemoryFullFailurePolicy lets FAILURE_POLICY answer.
	MemoryFullFailurePolicy
)

// MemoryFullPolicyNames are the names of the memory full policies, by value.
var MemoryFullPolicyNames = []string{"deny", "failure-policy"}

func (p MemoryFullPolicy) String() string {
	if int(p) < len(MemoryFullPolicyNames) {
		return MemoryFullPolicyNames[p]
	}
	return fmt.Sprintf("MemoryFullPolicy(%d)", p)
}

// parseMemoryFullPolicy parses deny or failure-policy; "" is deny.
func parseMemoryFullPolicy(s string) (MemoryFullPolicy, error) {
	switch s {
	case "", "deny":
		return MemoryFullDeny, nil
	case "failure-policy":
		return MemoryFullFailurePolicy, nil
	}
	return MemoryFullDeny, fmt.Errorf("unknown memory full policy %q (want deny or failure-policy)", s)
}
