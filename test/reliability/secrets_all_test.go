package reliability

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/credentials"

	"github.com/budgetgen/budgetgen/internal/tlsconfig"
	"github.com/budgetgen/budgetgen/internal/tlsconfig/tlstest"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// markerPassword is the marker value given to every secret-bearing setting
// here; like the passwords of TestSecretsNeverLogged it holds secretCore.
const markerPassword = "mk-" + secretCore + "-marker"

// keyMarker returns a slice of a private key file's base64 body: the key's
// content is a secret too and must never be shown.
func keyMarker(t *testing.T, keyFile string) string {
	t.Helper()
	b, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 3 || len(lines[1]) < 40 {
		t.Fatalf("unexpected key file layout in %s", keyFile)
	}
	return lines[1][:40]
}

// TestNoSecretFromAnySetting sets every secret-bearing setting to a marker
// (REDIS_URL with ?password= and user:pass@, REDIS_AUTH, REDIS_SENTINEL_AUTH
// and their files, TLS certificate, key and CA files whose content is the
// marker) and checks that no start-up error, no log line at debug level,
// no metric and no debug page holds it; a normal start with real TLS keys
// checks that no byte of a key file's content is shown either.
func TestNoSecretFromAnySetting(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	requirePassword(t, vk.Addr, rightPassword)
	host, port := "127.0.0.1", strings.TrimPrefix(vk.Addr, "127.0.0.1:")
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", budgetsYAML)
	secretDir := t.TempDir()
	markerFile := filepath.Join(secretDir, "marker")
	if err := os.WriteFile(markerFile, []byte(markerPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	down := host + ":" + strconv.Itoa(valkeytest.FreePort(t))
	certDir := t.TempDir()
	ca := tlstest.NewCA(t, certDir, "budget-ca")
	srvPair := ca.Server("ratelimit")

	// Cases whose Valkey is unreachable may start (the service starts in
	// its failure policy and reconnects); they are checked running.
	unreachable := map[string]bool{"sentinel auth, sentinel down": true, "sentinel auth file, sentinel down": true, "valkey down, password set": true}
	for _, c := range []struct {
		name string
		env  map[string]string
	}{
		{"REDIS_URL ?password=", map[string]string{"REDIS_URL": vk.Addr + "?password=" + markerPassword}},
		{"REDIS_URL user:pass@", map[string]string{"REDIS_URL": "budget:" + markerPassword + "@" + vk.Addr}},
		{"REDIS_URL redis:// URL", map[string]string{"REDIS_URL": "redis://budget:" + markerPassword + "@" + vk.Addr}},
		{"REDIS_URL password as port", map[string]string{"REDIS_URL": host + ":" + markerPassword}},
		{"REDIS_URL password alone", map[string]string{"REDIS_URL": markerPassword}},
		{"REDIS_URL cluster seed", map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": vk.Addr + "," + host + ":" + port + "/" + markerPassword}},
		{"REDIS_AUTH wrong", map[string]string{"REDIS_AUTH": markerPassword}},
		{"REDIS_AUTH user:pass wrong", map[string]string{"REDIS_AUTH": "budget:" + markerPassword}},
		{"REDIS_AUTH and _FILE both", map[string]string{"REDIS_AUTH": markerPassword, "REDIS_AUTH_FILE": markerFile}},
		{"REDIS_AUTH_FILE wrong", map[string]string{"REDIS_AUTH_FILE": markerFile}},
		{"sentinel auth, sentinel down", map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster," + down, "REDIS_AUTH": markerPassword, "REDIS_SENTINEL_AUTH": markerPassword}},
		{"sentinel auth file, sentinel down", map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster," + down, "REDIS_SENTINEL_AUTH_FILE": markerFile}},
		{"sentinel name with password", map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster?password=" + markerPassword + "," + down}},
		{"valkey down, password set", map[string]string{"REDIS_URL": down, "REDIS_AUTH": markerPassword}},
		{"REDIS_TLS client pair of marker content", map[string]string{"REDIS_AUTH": markerPassword, "REDIS_TLS": "true", "REDIS_TLS_CLIENT_CERT": markerFile, "REDIS_TLS_CLIENT_KEY": markerFile}},
		{"REDIS_TLS CA of marker content", map[string]string{"REDIS_AUTH": markerPassword, "REDIS_TLS": "true", "REDIS_TLS_CACERT": markerFile}},
		{"gRPC server key of marker content", map[string]string{"REDIS_AUTH": rightPassword, "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": srvPair.CertFile, "GRPC_SERVER_TLS_KEY": markerFile}},
		{"gRPC server CA of marker content", map[string]string{"REDIS_AUTH": rightPassword, "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": srvPair.CertFile, "GRPC_SERVER_TLS_KEY": srvPair.KeyFile, "GRPC_SERVER_TLS_CA_CERT": markerFile}},
		{"xDS client key of marker content", map[string]string{"REDIS_AUTH": rightPassword, "CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": down, "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": markerFile, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": markerFile}},
	} {
		t.Run("start-up error/"+c.name, func(t *testing.T) {
			logs := &syncBuffer{}
			env := merge(valkeyEnv(vk.Addr), map[string]string{"LOG_LEVEL": "debug", "REDIS_TIMEOUT": "500ms"}, c.env)
			s, err := tryStartSvc(t, svcOptions{ConfigDir: dir, Logs: logs, Env: env})
			if err == nil {
				for range 3 {
					_, _ = s.client(0).ShouldRateLimit(t.Context(), req("rl", "user", "a"))
				}
				text := endpoints(t, s)
				s.stop()
				assertNoSecret(t, "HTTP endpoints", text)
				assertNoSecret(t, "logs", logs.String())
				if !unreachable[c.name] {
					t.Fatal("service started")
				}
				return
			}
			assertNoSecret(t, "start-up error", err.Error())
			assertNoSecret(t, "logs", logs.String())
		})
	}

	t.Run("normal start", func(t *testing.T) {
		envoy := ca.Client("envoy")
		clientTLS, err := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: envoy.CertFile, KeyFile: envoy.KeyFile, CAFile: ca.CertFile, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		logs := &syncBuffer{}
		env := merge(valkeyEnv(vk.Addr), map[string]string{
			"LOG_LEVEL": "debug", "REDIS_AUTH": rightPassword,
			// Set although unused by a standalone Valkey: still never shown.
			"REDIS_SENTINEL_AUTH": markerPassword,
			"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": srvPair.CertFile, "GRPC_SERVER_TLS_KEY": srvPair.KeyFile,
			"GRPC_SERVER_TLS_CA_CERT": ca.CertFile, "HTTP_JSON": "true", "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:0",
		})
		s := startSvc(t, svcOptions{ConfigDir: dir, Logs: logs, Env: env, ClientTLS: credentials.NewTLS(clientTLS)})
		for range 5 {
			call(t, s, req("rl", "user", "a"))
		}
		var text strings.Builder
		text.WriteString(s.metrics())
		for _, p := range []string{"/rlconfig", "/", "/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=1"} {
			resp, err := http.Get(s.debugURL + p)
			if err != nil {
				t.Fatalf("GET %s: %v", p, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			text.Write(b)
		}
		if err := s.stop(); err != nil {
			t.Fatal(err)
		}
		out := logs.String()
		if !strings.Contains(out, "counter store") || !strings.Contains(out, "grpc_tls=true") {
			t.Fatalf("logs lack the start-up lines, so the check would prove nothing:\n%s", out)
		}
		if !strings.Contains(text.String(), "ratelimit_") {
			t.Fatal("metrics scrape is empty, so the check would prove nothing")
		}
		assertNoSecret(t, "logs", out)
		assertNoSecret(t, "metrics and debug pages", text.String())
		for _, key := range []string{srvPair.KeyFile, envoy.KeyFile} {
			m := keyMarker(t, key)
			if strings.Contains(out, m) || strings.Contains(text.String(), m) {
				t.Errorf("content of key file %s shown", key)
			}
		}
	})
}
