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
	for env, want := range map[string]string{
		"VALKEY_IDEMPOTENCY_WINDOW": "VALKEY_IDEMPOTENCY_WINDOW",
		"MEMORY_FULL_POLICY":        "MEMORY_FULL_POLICY",
	} {
		bad := map[string]string{"VALKEY_IDEMPOTENCY_WINDOW": "2h", "MEMORY_FULL_POLICY": "allow"}
		_, err := Load(nil, envOf(map[string]string{env: bad[env]}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s=%s: err %v, want it to name %s", env, bad[env], err, want)
		}
	}
}
