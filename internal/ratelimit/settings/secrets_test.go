package settings

import (
	"io"
	"strings"
	"testing"
)

// TestSecretFilesAndMemoryBound: REDIS_AUTH_FILE and MEMORY_MAX_COUNTERS
// are read; a secret given both inline and as a file is refused, and the
// error never carries the inline value.
func TestSecretFilesAndMemoryBound(t *testing.T) {
	s, err := Load(nil, envOf(map[string]string{"REDIS_AUTH_FILE": "/run/secrets/auth", "REDIS_SENTINEL_AUTH_FILE": "/run/secrets/s", "MEMORY_MAX_COUNTERS": "5000"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.RedisAuthFile != "/run/secrets/auth" || s.RedisSentinelAuthFile != "/run/secrets/s" || s.MemoryMaxCounters != 5000 {
		t.Fatalf("settings: %+v", s)
	}
	for name, env := range map[string]map[string]string{
		"both auth":          {"REDIS_AUTH": "pw-inline-1", "REDIS_AUTH_FILE": "/f"},
		"both sentinel auth": {"REDIS_SENTINEL_AUTH": "pw-inline-1", "REDIS_SENTINEL_AUTH_FILE": "/f"},
		"negative bound":     {"MEMORY_MAX_COUNTERS": "-1"},
	} {
		_, err := Load(nil, envOf(env), io.Discard)
		if err == nil {
			t.Fatalf("%s: accepted", name)
		}
		if strings.Contains(err.Error(), "pw-inline-1") {
			t.Fatalf("%s: error carries the secret: %v", name, err)
		}
	}
}

// TestThresholdEventsURL: env and flag set it; a bad one is refused without
// echoing it (it may carry a token).
func TestThresholdEventsURL(t *testing.T) {
	s, err := Load(nil, envOf(map[string]string{"THRESHOLD_EVENTS_URL": "https://hooks.example/budget"}), io.Discard)
	if err != nil || s.ThresholdEventsURL != "https://hooks.example/budget" {
		t.Fatalf("env: %v %q", err, s.ThresholdEventsURL)
	}
	s, err = Load([]string{"--threshold-events-url", "http://127.0.0.1:9/x"}, envOf(nil), io.Discard)
	if err != nil || s.ThresholdEventsURL != "http://127.0.0.1:9/x" {
		t.Fatalf("flag: %v %q", err, s.ThresholdEventsURL)
	}
	if s, _ := Load(nil, envOf(nil), io.Discard); s.ThresholdEventsURL != "" {
		t.Fatal("on by default")
	}
	_, err = Load(nil, envOf(map[string]string{"THRESHOLD_EVENTS_URL": "ftp://hooks/?token=tok-secret-1"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "THRESHOLD_EVENTS_URL") || strings.Contains(err.Error(), "tok-secret-1") {
		t.Fatalf("bad URL: %v", err)
	}
}
