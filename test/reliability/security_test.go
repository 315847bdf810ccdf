package reliability

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/budgetgen/budgetgen/internal/tlsconfig"
	"github.com/budgetgen/budgetgen/internal/tlsconfig/tlstest"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// secretCore is in every password used here; it must never appear in any
// log line, error or HTTP endpoint of the service.
const secretCore = "Zq8r1Vt"

const (
	rightPassword = "pw-" + secretCore + "-right"
	wrongPassword = "pw-" + secretCore + "-wrong"
)

// endpoints returns everything the service shows over HTTP that could carry
// a secret: metrics, the loaded config, the debug index, pprof's cmdline.
func endpoints(t *testing.T, s *svc) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(s.metrics())
	for _, p := range []string{"/rlconfig", "/", "/debug/pprof/cmdline"} {
		resp, err := http.Get(s.debugURL + p)
		if err != nil {
			t.Fatalf("GET %s: %v", p, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		b.Write(body)
	}
	resp, err := http.Get(s.httpURL + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	b.Write(body)
	return b.String()
}

func assertNoSecret(t *testing.T, where, text string) {
	t.Helper()
	if strings.Contains(text, secretCore) {
		i := strings.Index(text, secretCore)
		t.Errorf("secret in %s: ...%s...", where, text[max(0, i-200):min(len(text), i+50)])
	}
}

// TestSecretsNeverLogged runs the service at LOG_LEVEL=debug, in text and
// JSON, against a Valkey that requires a password: with the right password
// (from REDIS_AUTH, and as user:password from REDIS_AUTH_FILE) while Valkey
// is killed and restarted under calls, with a wrong password, and with
// Valkey down at start. Every log line, start-up error and HTTP endpoint
// (metrics, /rlconfig, debug index, pprof cmdline, healthcheck) is
// captured; the password never appears in any of them.
func TestSecretsNeverLogged(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	requirePassword(t, vk.Addr, rightPassword)
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", budgetsYAML)
	authFile := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(authFile, []byte("budget:"+rightPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrongFile := filepath.Join(t.TempDir(), "wrong")
	if err := os.WriteFile(wrongFile, []byte(wrongPassword), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"text", "json"} {
		for _, c := range []struct{ name, key, value string }{
			{"REDIS_AUTH", "REDIS_AUTH", rightPassword},
			{"REDIS_AUTH_FILE user:password", "REDIS_AUTH_FILE", authFile},
		} {
			t.Run(format+"/"+c.name, func(t *testing.T) {
				logs := &syncBuffer{}
				s := startSvc(t, svcOptions{ConfigDir: dir, Logs: logs, Env: merge(valkeyEnv(vk.Addr), map[string]string{
					c.key: c.value, "LOG_LEVEL": "debug", "LOG_FORMAT": format, "CACHE_KEY_PREFIX": "sec:",
				})})
				if resp := call(t, s, req("rl", "user", "a")); resp.Statuses[0].LimitRemaining >= bigLimit {
					t.Fatalf("not answered from Valkey: %v", resp)
				}
				// Valkey stalled for 3 s under calls: the store logs failures
				// at debug, tears the stalled connections down and dials
				// again (with the password) once Valkey answers.
				vk.Stop()
				deadline := time.Now().Add(3 * time.Second)
				for time.Now().Before(deadline) {
					call(t, s, req("rl", "user", "a"))
					time.Sleep(10 * time.Millisecond) // stays: paces the calls into the stall
				}
				vk.Cont()
				if !waitUntil(5*time.Second, func() bool {
					return call(t, s, req("rl", "user", "a")).Statuses[0].LimitRemaining < bigLimit
				}) {
					t.Fatal("service did not reconnect with its password")
				}
				text := endpoints(t, s)
				if err := s.stop(); err != nil {
					t.Fatal(err)
				}
				out := logs.String()
				if !strings.Contains(out, "store charge failed") || !strings.Contains(out, "counter store") {
					t.Fatalf("logs lack the store failure and start-up lines, so the check would prove nothing:\n%s", out)
				}
				assertNoSecret(t, "logs", out)
				assertNoSecret(t, "HTTP endpoints", text)
			})
		}
		for _, c := range []struct {
			name string
			env  map[string]string
			want string
		}{
			{"wrong password", map[string]string{"REDIS_AUTH": wrongPassword}, "WRONGPASS"},
			{"wrong password file", map[string]string{"REDIS_AUTH_FILE": wrongFile}, "WRONGPASS"},
		} {
			t.Run(format+"/"+c.name, func(t *testing.T) {
				logs := &syncBuffer{}
				env := merge(valkeyEnv(vk.Addr), map[string]string{"LOG_LEVEL": "debug", "LOG_FORMAT": format, "REDIS_TIMEOUT": "500ms"}, c.env)
				s, err := tryStartSvc(t, svcOptions{ConfigDir: dir, Logs: logs, Env: env})
				if err == nil {
					s.stop()
					t.Fatal("service started")
				}
				if !strings.Contains(err.Error(), c.want) {
					t.Errorf("start-up error does not say %q: %v", c.want, err)
				}
				assertNoSecret(t, "start-up error", err.Error())
				assertNoSecret(t, "logs", logs.String())
			})
		}
		// Valkey down is an outage, not a setting to fix: the service
		// starts (not ready, buffering) and says so without the password.
		t.Run(format+"/valkey down", func(t *testing.T) {
			logs := &syncBuffer{}
			env := merge(valkeyEnv(vk.Addr), map[string]string{"LOG_LEVEL": "debug", "LOG_FORMAT": format, "REDIS_TIMEOUT": "500ms",
				"REDIS_AUTH": rightPassword, "REDIS_URL": "127.0.0.1:" + strconv.Itoa(valkeytest.FreePort(t))})
			s, err := tryStartSvc(t, svcOptions{ConfigDir: dir, Logs: logs, Env: env})
			if err != nil {
				t.Fatalf("service did not start with Valkey down: %v", err)
			}
			s.stop()
			if !strings.Contains(logs.String(), "valkey unreachable at start") {
				t.Fatalf("logs do not say Valkey was unreachable, so the check would prove nothing:\n%s", logs)
			}
			assertNoSecret(t, "logs", logs.String())
		})
	}
}

// TestTLSEndToEnd: the gRPC server requires TLS with client certificates
// (GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT/KEY, GRPC_SERVER_TLS_CA_CERT:
// what Envoy Gateway sets), and the service reaches Valkey only over TLS
// with a client certificate and a password (REDIS_TLS, REDIS_TLS_CACERT,
// REDIS_TLS_CLIENT_CERT/KEY, REDIS_AUTH). Certificates are made here. A
// call over mTLS is charged in Valkey; a plaintext client, a TLS client
// without a certificate and a client with another CA's certificate are
// refused; a service trusting the wrong CA for Valkey does not start.
func TestTLSEndToEnd(t *testing.T) {
	certDir := t.TempDir()
	ca := tlstest.NewCA(t, certDir, "budget-ca")
	other := tlstest.NewCA(t, certDir, "other-ca")
	vkPair, svcPair, rlsServer, envoyClient := ca.Server("valkey"), ca.Client("ratelimit"), ca.Server("ratelimit-grpc"), ca.Client("envoy")
	strangerPair := other.Client("stranger")
	tlsPort := valkeytest.FreePort(t)
	vk := valkeytest.Start(t, valkeytest.Options{Args: []string{
		"--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", vkPair.CertFile, "--tls-key-file", vkPair.KeyFile, "--tls-ca-cert-file", ca.CertFile,
		"--tls-auth-clients", "yes",
	}})
	requirePassword(t, vk.Addr, rightPassword)
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 10}\n")
	env := map[string]string{
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:" + strconv.Itoa(tlsPort), "REDIS_AUTH": rightPassword,
		"REDIS_TLS": "true", "REDIS_TLS_CACERT": ca.CertFile,
		"REDIS_TLS_CLIENT_CERT": svcPair.CertFile, "REDIS_TLS_CLIENT_KEY": svcPair.KeyFile,
		"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": rlsServer.CertFile, "GRPC_SERVER_TLS_KEY": rlsServer.KeyFile,
		"GRPC_SERVER_TLS_CA_CERT": ca.CertFile, "CACHE_KEY_PREFIX": "tls:", "LOG_LEVEL": "info",
	}
	clientTLS, err := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: envoyClient.CertFile, KeyFile: envoyClient.KeyFile, CAFile: ca.CertFile, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	s := startSvc(t, svcOptions{ConfigDir: dir, Env: env, ClientTLS: credentials.NewTLS(clientTLS)})
	if out := s.logs.String(); !strings.Contains(out, "tls=true") || !strings.Contains(out, "grpc_tls=true") {
		t.Errorf("start-up log does not say both TLS links are on:\n%s", out)
	}
	for i := 1; i <= 3; i++ {
		resp := call(t, s, req("rl", "user", "alice"))
		if resp.OverallCode != rlpb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != uint32(10-i) {
			t.Fatalf("call %d over mTLS: %v", i, resp)
		}
	}
	// The counter is in Valkey (read on its plain port, with the password).
	keys, err := valkeytest.Do(vk.Addr, "KEYS", counterKeys("tls:"))
	if err == nil {
		t.Fatalf("plain-port client without AUTH read keys: %q", keys)
	}
	if n := countAuthed(t, vk.Addr, counterKeys("tls:")); n != 3 {
		t.Fatalf("Valkey total for alice = %d, want 3", n)
	}

	// Clients the server must refuse.
	stranger, err := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: strangerPair.CertFile, KeyFile: strangerPair.KeyFile, CAFile: ca.CertFile, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	noCert, err := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: ca.CertFile, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	for name, creds := range map[string]credentials.TransportCredentials{
		"plaintext":                 insecure.NewCredentials(),
		"TLS without client cert":   credentials.NewTLS(noCert),
		"client cert of another CA": credentials.NewTLS(stranger),
	} {
		conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = rlpb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req("rl", "user", "mallory"))
		cancel()
		conn.Close()
		if err == nil {
			t.Errorf("%s client was served", name)
		} else {
			t.Logf("%s client refused: %v", name, err)
		}
	}
	if n := countAuthed(t, vk.Addr, counterKeys("tls:")); n != 3 {
		t.Fatalf("refused clients changed the counters: total %d, want 3", n)
	}

	// The service does not reach Valkey with a CA that did not sign its
	// certificate, nor without a client certificate.
	for name, override := range map[string]map[string]string{
		"wrong CA for valkey":       {"REDIS_TLS_CACERT": other.CertFile},
		"no client cert for valkey": {"REDIS_TLS_CLIENT_CERT": "", "REDIS_TLS_CLIENT_KEY": ""},
		"plain TCP to the TLS port": {"REDIS_TLS": "false"},
	} {
		_, err := tryStartSvc(t, svcOptions{ConfigDir: dir, Env: merge(env, override, map[string]string{"REDIS_TIMEOUT": "500ms"})})
		if err == nil {
			t.Errorf("%s: service started", name)
			continue
		}
		assertNoSecret(t, name+" error", err.Error())
		t.Logf("%s: %v", name, strings.SplitN(err.Error(), "\n", 2)[0])
	}
}

// countAuthed sums the counters matching pattern, authenticating on the
// plain port with a raw RESP client (AUTH, then KEYS and GET on one
// connection).
func countAuthed(t *testing.T, addr, pattern string) int {
	t.Helper()
	out, err := valkeytest.DoAuth(addr, rightPassword, "KEYS", pattern)
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	total := 0
	for _, k := range strings.Fields(out) {
		v, err := valkeytest.DoAuth(addr, rightPassword, "GET", k)
		if err != nil {
			t.Fatalf("GET %s: %v", k, err)
		}
		n, _ := strconv.Atoi(v)
		total += n
	}
	return total
}
