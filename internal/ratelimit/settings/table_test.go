package settings

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

// TestTableNamesEachSettingOnce: no environment variable or flag is bound
// twice, every setting has a doc, and -help shows each flag with its
// environment variables.
func TestTableNamesEachSettingOnce(t *testing.T) {
	s := Defaults()
	var r raw
	envs, flags := map[string]bool{}, map[string]bool{}
	for _, st := range table(&s, &r) {
		if st.doc == "" || (len(st.env) == 0 && st.flag == "") {
			t.Errorf("setting %v/%q has no doc or no name", st.env, st.flag)
		}
		for _, e := range st.env {
			if envs[e] {
				t.Errorf("%s bound twice", e)
			}
			envs[e] = true
		}
		if st.flag != "" {
			if flags[st.flag] {
				t.Errorf("flag %s bound twice", st.flag)
			}
			flags[st.flag] = true
		}
	}
	var help bytes.Buffer
	if _, err := Load([]string{"-help"}, envOf(nil), &help); err == nil {
		t.Fatal("-help did not stop Load")
	}
	for _, want := range []string{"REDIS_URL, --redis-url", "STORE_TIMEOUT, --store-timeout", "CONFIG_DIR, --config-dir"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("-help lacks %q:\n%s", want, help.String())
		}
	}
}

// TestTableValues: each kind of value parses from env and flags alike, a
// boolean flag needs no value, and the alias of Envoy Gateway wins.
func TestTableValues(t *testing.T) {
	s, err := Load([]string{"--shadow-mode", "--store-timeout", "40ms", "--near-limit-ratio", "0.5"},
		envOf(map[string]string{"GRPC_CLIENT_TLS_CACERT": "/ref", "GRPC_SERVER_TLS_CA_CERT": "/eg", "EXPIRATION_JITTER_MAX_SECONDS": " 60 ", "CONFIG_POLL_INTERVAL": "2s"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !s.ShadowMode || s.StoreTimeout != 40*time.Millisecond || s.NearLimitRatio != 0.5 || s.GRPCClientTLSCACert != "/eg" ||
		s.Grace != time.Minute || s.ConfigPollInterval != 2*time.Second {
		t.Fatalf("%+v", s)
	}
	if _, err := Load(nil, envOf(map[string]string{"STORE_TIMEOUT": "soon"}), io.Discard); err == nil || !strings.Contains(err.Error(), `STORE_TIMEOUT: not a duration: "soon"`) {
		t.Fatalf("err = %v", err)
	}
}

// TestValidateNamesSettingsFromTable: with every validated setting out of
// range, Validate reports each, and every error names a setting the table
// binds (envName found it: no error starts with an empty name).
func TestValidateNamesSettingsFromTable(t *testing.T) {
	s := Defaults()
	s.Port, s.GRPCPort, s.DebugPort = -1, 70000, -1
	s.MemoryLimitRatio, s.NearLimitRatio = 2, -1
	s.GRPCStreamWorkers, s.GRPCServerImpl, s.GRPCMaxConnections, s.GRPCIdleTimeout = -1, "x", -1, -1
	s.BudgetUsageTopPrincipals = -1
	s.ValkeyMaxFlushDelay, s.ValkeyIdempotencyWindow, s.StoreTimeout = time.Hour, time.Millisecond, 0
	s.LedgerRetentionDays, s.ThresholdEventsURL = 0, "ftp://x"
	s.MemorySnapshotInterval, s.MemorySnapshotPath, s.MemoryMaxCounters = 0, "snap", -1
	s.RedisURL, s.RedisSocketType = "127.0.0.1:6379", "unix"
	s.RedisAuth, s.RedisAuthFile, s.RedisSentinelAuth, s.RedisSentinelAuthFile = "a", "f", "a", "f"
	s.LogLevel, s.HTTPJSON, s.LogFormat, s.ConfigType = "x", "x", "x", "x"
	err := s.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	names := map[string]bool{}
	for _, st := range table(&s, &raw{}) {
		for _, e := range st.env {
			names[e] = true
		}
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 25 {
		t.Errorf("%d errors, want one per broken setting (25):\n%v", len(lines), err)
	}
	for _, l := range lines {
		first := strings.FieldsFunc(l, func(r rune) bool { return r == ':' || r == ' ' })
		if len(first) == 0 || !names[first[0]] {
			t.Errorf("error %q does not start with a setting of the table", l)
		}
	}
}
