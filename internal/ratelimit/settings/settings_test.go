package settings

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestDefaultsMatchReference(t *testing.T) {
	s, err := Load(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// The debug port (pprof, /ledger/) is loopback unless exposed on
	// purpose; the reference binds it to 0.0.0.0.
	if s.GRPCAddr() != "0.0.0.0:8081" || s.HTTPAddr() != "0.0.0.0:8080" || s.DebugAddr() != "127.0.0.1:6070" || s.HTTPJSON != HTTPJSONAuto {
		t.Fatalf("addresses %s %s %s, HTTP_JSON %q", s.GRPCAddr(), s.HTTPAddr(), s.DebugAddr(), s.HTTPJSON)
	}
	if s.PrometheusAddr != ":9090" || s.UsePrometheus || s.LogLevel != "INFO" || s.NearLimitRatio != 0.8 {
		t.Fatalf("defaults: %+v", s)
	}
	if !s.UseMemoryStore() || s.KeyFormat != key.Safe || s.FailurePolicy != decide.FailAllow || s.StoreTimeout != 15*time.Millisecond {
		t.Fatalf("our defaults: %+v", s)
	}
	if d := s.DirOptions(); d.Dir() != "/srv/runtime_data/current/config" {
		t.Fatalf("config dir %s", d.Dir())
	}
}

func TestEnvoyGatewayEnvironment(t *testing.T) {
	env := map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true",
		"RUNTIME_WATCH_ROOT": "false", "LOG_LEVEL": "info", "USE_STATSD": "false",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "valkey.svc:6379", "REDIS_AUTH": "user:s3cret",
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		"SHADOW_MODE": "true", "NEAR_LIMIT_RATIO": "0.9", "CACHE_KEY_PREFIX": "p_", "KEY_FORMAT": "envoy",
		"FAILURE_POLICY": "deny", "EXPIRATION_JITTER_MAX_SECONDS": "60", "REDIS_POOL_SIZE": "20",
	}
	s, err := Load(nil, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.DirOptions().Dir() != "/data/ratelimit/config" || !s.DirOptions().IgnoreDotFiles {
		t.Fatalf("dir %+v", s.DirOptions())
	}
	if s.UseMemoryStore() || s.RedisURL != "valkey.svc:6379" || !s.UsePrometheus || s.PrometheusAddr != ":19001" {
		t.Fatalf("store/metrics: %+v", s)
	}
	if !s.ShadowMode || s.NearLimitRatio != float32(0.9) || s.CacheKeyPrefix != "p_" || s.KeyFormat != key.Envoy || s.FailurePolicy != decide.FailDeny || s.Grace != time.Minute {
		t.Fatalf("decisions: %+v", s)
	}
	if u, p := RedisCredentials(s.RedisAuth); u != "user" || p != "s3cret" {
		t.Fatalf("credentials %q %q", u, p)
	}
	if len(s.Unsupported) != 1 || !strings.HasPrefix(s.Unsupported[0], "REDIS_POOL_SIZE is set but ignored") {
		t.Fatalf("unsupported = %q (USE_STATSD=false is neutral)", s.Unsupported)
	}
	for _, u := range s.Unsupported {
		if strings.Contains(u, "20") {
			t.Fatal("unsupported report leaks a value")
		}
	}
}

func TestFlagsOverrideEnv(t *testing.T) {
	s, err := Load([]string{"--config-dir", "/tmp/x", "--grpc-port", "9001", "--key-format", "envoy", "--redis-url", "127.0.0.1:1"},
		envOf(map[string]string{"GRPC_PORT": "7000", "KEY_FORMAT": "safe", "REDIS_SOCKET_TYPE": "tcp"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.GRPCPort != 9001 || s.KeyFormat != key.Envoy || s.DirOptions().Dir() != "/tmp/x" || s.RedisURL != "127.0.0.1:1" {
		t.Fatalf("%+v", s)
	}
}

func TestGRPCServerSettings(t *testing.T) {
	s, err := Load(nil, envOf(nil), io.Discard)
	if err != nil || s.GRPCServerImpl != "lean" || s.GRPCMaxConnections != DefaultGRPCMaxConnections || s.GRPCIdleTimeout != 0 {
		t.Fatalf("defaults: %+v %v", s, err)
	}
	// Only an explicit 0 lifts the cap.
	if s, err = Load(nil, envOf(map[string]string{"GRPC_MAX_CONNECTIONS": "0"}), io.Discard); err != nil || s.GRPCMaxConnections != 0 {
		t.Fatalf("GRPC_MAX_CONNECTIONS=0: %d %v, want no cap", s.GRPCMaxConnections, err)
	}
	s, err = Load([]string{"--grpc-server-impl", "grpc-go"},
		envOf(map[string]string{"GRPC_SERVER_IMPL": "lean", "GRPC_MAX_CONNECTIONS": "300", "GRPC_IDLE_TIMEOUT": "90s"}), io.Discard)
	if err != nil || s.GRPCServerImpl != "grpc-go" || s.GRPCMaxConnections != 300 || s.GRPCIdleTimeout != 90*time.Second {
		t.Fatalf("set: %+v %v", s, err)
	}
}

func TestInvalidSettings(t *testing.T) {
	cases := map[string]struct {
		env  map[string]string
		args []string
		want string
	}{
		"bad port":        {env: map[string]string{"PORT": "x"}, want: "PORT: not an integer"},
		"port range":      {args: []string{"--port", "70000"}, want: "PORT: 70000 is not a port"},
		"bad bool":        {env: map[string]string{"SHADOW_MODE": "maybe"}, want: "SHADOW_MODE: not a boolean"},
		"bad key format":  {env: map[string]string{"KEY_FORMAT": "nope"}, want: "KEY_FORMAT: unknown key format"},
		"bad policy":      {env: map[string]string{"FAILURE_POLICY": "maybe"}, want: "FAILURE_POLICY: unknown failure policy"},
		"ratio":           {env: map[string]string{"NEAR_LIMIT_RATIO": "1.5"}, want: "NEAR_LIMIT_RATIO"},
		"ratio NaN":       {env: map[string]string{"NEAR_LIMIT_RATIO": "NaN"}, want: "NEAR_LIMIT_RATIO: not a number"},
		"memory NaN":      {env: map[string]string{"MEMORY_LIMIT_RATIO": "nan"}, want: "MEMORY_LIMIT_RATIO: not a number"},
		"unix socket":     {env: map[string]string{"REDIS_URL": "/var/run/x.sock"}, want: "REDIS_SOCKET_TYPE"},
		"sentinel format": {env: map[string]string{"REDIS_URL": "a:1", "REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "sentinel"}, want: "sentinel wants"},
		"redis type":      {env: map[string]string{"REDIS_URL": "a:1", "REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "ring"}, want: "REDIS_TYPE"},
		"log format":      {env: map[string]string{"LOG_FORMAT": "xml"}, want: "LOG_FORMAT"},
		"config type":     {env: map[string]string{"CONFIG_TYPE": "CONSUL"}, want: "CONFIG_TYPE"},
		"unknown flag":    {args: []string{"--nope"}, want: "flag provided but not defined"},
		"extra args":      {args: []string{"x"}, want: "unexpected arguments"},
		"server impl":     {env: map[string]string{"GRPC_SERVER_IMPL": "netty"}, want: `GRPC_SERVER_IMPL: "netty" is neither lean nor grpc-go`},
		"max conns":       {args: []string{"--grpc-max-connections", "-1"}, want: "GRPC_MAX_CONNECTIONS"},
		"idle timeout":    {env: map[string]string{"GRPC_IDLE_TIMEOUT": "soon"}, want: "GRPC_IDLE_TIMEOUT: not a duration"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Load(tc.args, envOf(tc.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// Credentials in REDIS_URL are refused without echoing them: the addresses
// reach start-up logs and connection errors.
func TestRedisURLCredentialsRefusedUnechoed(t *testing.T) {
	for _, typ := range []string{"single", "cluster", "sentinel"} {
		env := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": typ,
			"REDIS_URL": "redis://default:s3cretPW@valkey:6379"}
		if typ == "sentinel" {
			env["REDIS_URL"] = "mymaster,user:s3cretPW@sentinel-0:26379"
		}
		_, err := Load(nil, envOf(env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "holds more than host:port") {
			t.Fatalf("%s: err = %v, want a credentials error", typ, err)
		}
		if strings.Contains(err.Error(), "s3cretPW") {
			t.Fatalf("%s: the error echoes the password: %v", typ, err)
		}
	}
	// A password as a query, in the master name, or a malformed port: refused,
	// never echoed.
	for _, c := range []struct{ typ, url string }{
		{"single", "valkey:6379?password=s3cretPW"},
		{"cluster", "a:6379,b:6379/?password=s3cretPW"},
		{"single", "valkey:s3cretPW"},
		{"single", "s3cretPW"},
		{"sentinel", "mymaster?password=s3cretPW,sentinel-0:26379"},
		{"sentinel", "mymaster,sentinel-0:26379#s3cretPW"},
	} {
		_, err := Load(nil, envOf(map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": c.typ, "REDIS_URL": c.url}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "REDIS_URL: entry") {
			t.Errorf("%s %s: err = %v, want REDIS_URL refused", c.typ, c.url, err)
		} else if strings.Contains(err.Error(), "s3cretPW") {
			t.Errorf("%s: the error echoes the password: %v", c.typ, err)
		}
	}
}

func TestExposureSettings(t *testing.T) {
	s, err := Load(nil, envOf(map[string]string{"DEBUG_HOST": "0.0.0.0", "HTTP_JSON": "true"}), io.Discard)
	if err != nil || s.DebugAddr() != "0.0.0.0:6070" || s.HTTPJSON != HTTPJSONTrue {
		t.Fatalf("explicit exposure: %v %s %q", err, s.DebugAddr(), s.HTTPJSON)
	}
	if _, err := Load(nil, envOf(map[string]string{"HTTP_JSON": "yes please"}), io.Discard); err == nil || !strings.Contains(err.Error(), "HTTP_JSON") {
		t.Fatalf("bad HTTP_JSON: %v", err)
	}
}

// FuzzRedisURLNeverEchoed: whatever REDIS_URL holds, a settings error never
// quotes it, and an accepted entry is a bare host:port.
func FuzzRedisURLNeverEchoed(f *testing.F) {
	for _, s := range []string{"valkey:6379", "a:1?password=Secret123", "u:Secret123@h:1", "redis://h:6379", "h:Secret123", "mymaster,s:26379#Secret123"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, url string, sentinel bool) {
		typ := "single"
		if sentinel {
			typ = "sentinel"
		}
		marker := "Secret123"
		if !strings.Contains(url, marker) || strings.TrimSpace(url) == "" {
			return
		}
		_, err := Load(nil, envOf(map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": typ, "REDIS_URL": url}), io.Discard)
		if err != nil && strings.Contains(err.Error(), marker) {
			t.Fatalf("error echoes REDIS_URL: %v", err)
		}
		if err == nil {
			for i, a := range strings.Split(url, ",") {
				if (i > 0 || !sentinel) && strings.ContainsAny(a, "@?/#") {
					t.Fatalf("accepted entry %q", a)
				}
			}
		}
	})
}

// REDIS_URL=host:port alone implies tcp: the reference's unix default would
// refuse the one setting a user gave. An explicit REDIS_SOCKET_TYPE keeps
// the reference's meaning (unix is refused), and a socket path with the
// socket type unset is refused naming both settings, never echoing the URL.
func TestRedisSocketTypeFollowsURL(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want string // "" = accepted
	}{
		{"host:port alone", map[string]string{"REDIS_URL": "valkey.valkey.svc:6379"}, ""},
		{"cluster seeds alone", map[string]string{"REDIS_URL": "a:6379,b:6379", "REDIS_TYPE": "cluster"}, ""},
		{"explicit tcp", map[string]string{"REDIS_URL": "valkey:6379", "REDIS_SOCKET_TYPE": "TCP"}, ""},
		{"explicit unix", map[string]string{"REDIS_URL": "valkey:6379", "REDIS_SOCKET_TYPE": "unix"}, `REDIS_SOCKET_TYPE: "unix" is not supported`},
		{"socket path", map[string]string{"REDIS_URL": "/var/run/valkey.sock"}, "REDIS_SOCKET_TYPE: unset, and REDIS_URL is a unix socket path"},
		{"unix scheme", map[string]string{"REDIS_URL": "unix:///run/secret-path.sock"}, "unix socket path"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(nil, envOf(c.env), io.Discard)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("err = %v, want %q", err, c.want)
			case err != nil && strings.Contains(err.Error(), "secret-path"):
				t.Fatalf("error echoes REDIS_URL: %v", err)
			}
		})
	}
}

// TestXDSClientSettingsReported: the reference's xDS client settings have no
// effect here; one set to a value that would change the reference's
// behaviour is reported at start, not ignored silently.
func TestXDSClientSettingsReported(t *testing.T) {
	s, err := Load(nil, envOf(map[string]string{"XDS_CLIENT_BACKOFF_MAX_INTERVAL": "60s", "XDS_CLIENT_BACKOFF_JITTER": "true"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Unsupported) != 1 || !strings.HasPrefix(s.Unsupported[0], "XDS_CLIENT_BACKOFF_MAX_INTERVAL is set but ignored") {
		t.Fatalf("unsupported = %q, want XDS_CLIENT_BACKOFF_MAX_INTERVAL alone (jitter on is neutral)", s.Unsupported)
	}
}

// TestXDSClientMaxMsgSize: the reference's receive limit for xDS responses
// is honoured (a config larger than the default must be loadable), and a
// negative one refused.
func TestXDSClientMaxMsgSize(t *testing.T) {
	s, err := Load(nil, envOf(map[string]string{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "33554432"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.XDSClientMaxMsgSize != 32<<20 || len(s.Unsupported) != 0 {
		t.Errorf("max %d, unsupported %q", s.XDSClientMaxMsgSize, s.Unsupported)
	}
	if _, err := Load(nil, envOf(map[string]string{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "-1"}), io.Discard); err == nil || !strings.Contains(err.Error(), "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
		t.Errorf("a negative limit: %v", err)
	}
}

// TestClientSANWithoutCAReported: GRPC_CLIENT_TLS_SAN without a client CA
// checks nothing (no client certificate is asked for), and says so.
func TestClientSANWithoutCAReported(t *testing.T) {
	s, err := Load(nil, envOf(map[string]string{"GRPC_CLIENT_TLS_SAN": "envoy.example"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Unsupported) != 1 || !strings.HasPrefix(s.Unsupported[0], "GRPC_CLIENT_TLS_SAN is set but ignored") {
		t.Fatalf("unsupported = %q", s.Unsupported)
	}
	s, err = Load(nil, envOf(map[string]string{"GRPC_CLIENT_TLS_SAN": "envoy.example", "GRPC_CLIENT_TLS_CACERT": "/etc/ca.pem"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Unsupported) != 0 {
		t.Fatalf("with a CA: unsupported = %q, want none", s.Unsupported)
	}
}
