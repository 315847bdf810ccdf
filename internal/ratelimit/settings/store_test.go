package settings

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store/memory"
)

// TestStoreSettings: the store settings of issue 16 (idempotent Valkey
// charges, the memory store's full policy and snapshot) parse, default and
// refuse bad values with the setting's name.
func TestStoreSettings(t *testing.T) {
	s, err := Load(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.ValkeyIdempotentCharges || s.ValkeyIdempotencyWindow != 0 || s.MemoryFullPolicy != memory.FullDeny {
		t.Fatalf("defaults: %+v", s)
	}
	s, err = Load(nil, envOf(map[string]string{
		"VALKEY_IDEMPOTENT_CHARGES": "true", "VALKEY_IDEMPOTENCY_WINDOW": "2m", "MEMORY_FULL_POLICY": "failure-policy",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !s.ValkeyIdempotentCharges || s.ValkeyIdempotencyWindow != 2*time.Minute || s.MemoryFullPolicy != memory.FullFailurePolicy {
		t.Fatalf("set: idempotent %v window %v full policy %v", s.ValkeyIdempotentCharges, s.ValkeyIdempotencyWindow, s.MemoryFullPolicy)
	}
	if s.MemorySnapshotPath != "" || s.MemorySnapshotInterval != 10*time.Second {
		t.Fatalf("snapshot defaults: %q every %v", s.MemorySnapshotPath, s.MemorySnapshotInterval)
	}
	s, err = Load(nil, envOf(map[string]string{"MEMORY_SNAPSHOT_PATH": "/var/lib/rl/snap", "MEMORY_SNAPSHOT_INTERVAL": "30s"}), io.Discard)
	if err != nil || s.MemorySnapshotPath != "/var/lib/rl/snap" || s.MemorySnapshotInterval != 30*time.Second {
		t.Fatalf("snapshot settings: %q every %v, %v", s.MemorySnapshotPath, s.MemorySnapshotInterval, err)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"VALKEY_IDEMPOTENCY_WINDOW": "2h"}, "VALKEY_IDEMPOTENCY_WINDOW"},
		{map[string]string{"MEMORY_FULL_POLICY": "allow"}, "MEMORY_FULL_POLICY"},
		{map[string]string{"MEMORY_SNAPSHOT_INTERVAL": "10ms"}, "MEMORY_SNAPSHOT_INTERVAL"},
		{map[string]string{"MEMORY_SNAPSHOT_PATH": "/tmp/snap", "REDIS_URL": "127.0.0.1:6379"}, "MEMORY_SNAPSHOT_PATH"},
	} {
		_, err := Load(nil, envOf(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want it to name %s", tc.env, err, tc.want)
		}
	}
}
