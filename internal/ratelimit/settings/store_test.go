package settings

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStoreSettings: the store settings (the idempotency window, the
// memory store's full policy, snapshot and reservation expiry) parse,
// default and refuse bad values with the setting's name.
func TestStoreSettings(t *testing.T) {
	s, err := Load(nil, envOf(map[string]string{"HOME": "/home/u"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.ValkeyIdempotencyWindow != 0 || s.MemoryFullPolicy != MemoryFullDeny || s.ReservationExpiry != 10*time.Minute {
		t.Fatalf("defaults: %+v", s)
	}
	// The embedded store snapshots by default, under the user's state
	// directory (XDG_STATE_HOME wins; the image sets it).
	if s.MemorySnapshotPath != "/home/u/.local/state/budgetgen/ratelimit-memory-8081.snapshot" || s.MemorySnapshotInterval != 10*time.Second {
		t.Fatalf("snapshot defaults: %q every %v", s.MemorySnapshotPath, s.MemorySnapshotInterval)
	}
	// Neither set: a directory of this user's own in the temporary one,
	// not a file in a directory every user can write to.
	if s, err = Load(nil, envOf(map[string]string{}), io.Discard); err != nil || s.MemorySnapshotPath != filepath.Join(os.TempDir(), "budgetgen-"+strconv.Itoa(os.Getuid()), "ratelimit-memory-8081.snapshot") {
		t.Fatalf("snapshot path without HOME or XDG_STATE_HOME: %q, %v", s.MemorySnapshotPath, err)
	}
	s, err = Load(nil, envOf(map[string]string{
		"VALKEY_IDEMPOTENCY_WINDOW": "2m", "MEMORY_FULL_POLICY": "failure-policy", "RESERVATION_EXPIRY": "90s",
		"XDG_STATE_HOME": "/var/lib", "HOME": "/home/u",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.ValkeyIdempotencyWindow != 2*time.Minute || s.MemoryFullPolicy != MemoryFullFailurePolicy || s.ReservationExpiry != 90*time.Second {
		t.Fatalf("set: window %v full policy %v hold expiry %v", s.ValkeyIdempotencyWindow, s.MemoryFullPolicy, s.ReservationExpiry)
	}
	if s.MemorySnapshotPath != "/var/lib/budgetgen/ratelimit-memory-8081.snapshot" {
		t.Fatalf("snapshot path under XDG_STATE_HOME: %q", s.MemorySnapshotPath)
	}
	for _, off := range []string{"off", "OFF"} {
		if s, err = Load(nil, envOf(map[string]string{"MEMORY_SNAPSHOT_PATH": off, "HOME": "/home/u"}), io.Discard); err != nil || s.MemorySnapshotPath != "" {
			t.Fatalf("MEMORY_SNAPSHOT_PATH=%s: %q, %v; want snapshots off", off, s.MemorySnapshotPath, err)
		}
	}
	if s, err = Load(nil, envOf(map[string]string{"REDIS_URL": "127.0.0.1:6379", "REDIS_SOCKET_TYPE": "tcp", "HOME": "/home/u"}), io.Discard); err != nil || s.MemorySnapshotPath != "" {
		t.Fatalf("with Valkey: snapshot path %q, %v; want none (Valkey keeps the state)", s.MemorySnapshotPath, err)
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
		{map[string]string{"RESERVATION_EXPIRY": "100ms"}, "RESERVATION_EXPIRY"},
		{map[string]string{"MEMORY_SNAPSHOT_PATH": "/tmp/snap", "REDIS_URL": "127.0.0.1:6379"}, "MEMORY_SNAPSHOT_PATH"},
	} {
		_, err := Load(nil, envOf(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want it to name %s", tc.env, err, tc.want)
		}
	}
}

// TestValkeyBufferMaxBytes: VALKEY_BUFFER_MAX_BYTES (the Valkey store's
// outage buffer bound in bytes) defaults to 0, the store's own default,
// takes a byte count within [1 MiB, 4 GiB] and refuses anything else with
// an error naming the setting and the range.
func TestValkeyBufferMaxBytes(t *testing.T) {
	s, err := Load(nil, envOf(map[string]string{}), io.Discard)
	if err != nil || s.ValkeyBufferMaxBytes != 0 {
		t.Fatalf("default: %d, %v; want 0 (the store's default)", s.ValkeyBufferMaxBytes, err)
	}
	for _, v := range []int{MinBufferMaxBytes, 256 << 20, MaxBufferMaxBytes} {
		s, err := Load(nil, envOf(map[string]string{"VALKEY_BUFFER_MAX_BYTES": strconv.Itoa(v)}), io.Discard)
		if err != nil || s.ValkeyBufferMaxBytes != v {
			t.Errorf("VALKEY_BUFFER_MAX_BYTES=%d: %d, %v", v, s.ValkeyBufferMaxBytes, err)
		}
	}
	for _, v := range []string{"-1", "1000", strconv.Itoa(MinBufferMaxBytes - 1), strconv.Itoa(MaxBufferMaxBytes + 1), "64MiB"} {
		_, err := Load(nil, envOf(map[string]string{"VALKEY_BUFFER_MAX_BYTES": v}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "VALKEY_BUFFER_MAX_BYTES") {
			t.Errorf("VALKEY_BUFFER_MAX_BYTES=%s: err %v, want it refused by name", v, err)
		}
	}
	if _, err := Load(nil, envOf(map[string]string{"VALKEY_BUFFER_MAX_BYTES": "1000"}), io.Discard); err == nil || !strings.Contains(err.Error(), "not in [1048576 (1 MiB), 4294967296 (4 GiB)]") {
		t.Errorf("out of range: %v; want the range said", err)
	}
}
