package reliability

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/credentials"

	"github.com/budgetgen/budgetgen/internal/tlsconfig"
	"github.com/budgetgen/budgetgen/internal/tlsconfig/tlstest"
)

const jsonCharge = `{"domain":"rl","descriptors":[{"entries":[{"key":"user","value":"victim"}]}],"hitsAddend":4}`

// postJSON posts one /json charge of 4 hits and returns the status (0 when
// the connection itself was refused).
func postJSON(t *testing.T, client *http.Client, url string) int {
	t.Helper()
	resp, err := client.Post(url+"/json", "application/json", strings.NewReader(jsonCharge))
	if err != nil {
		t.Logf("POST %s/json: %v", url, err)
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func getStatus(t *testing.T, client *http.Client, url string) int {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Logf("GET %s: %v", url, err)
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestHTTPPortAsProtectedAsGRPC: with gRPC mTLS (what Envoy Gateway
// deploys), /json is no way around the client certificate. HTTP_JSON=auto
// (the default) leaves it off while /healthcheck answers plaintext probes;
// HTTP_JSON=true serves the HTTP port over TLS where /json needs a verified
// client certificate and /healthcheck answers a probe without one. Without
// gRPC TLS, /json behaves as in the reference. Each refused charge is
// checked against the victim's counter through gRPC: exactly the accepted
// charges are counted.
func TestHTTPPortAsProtectedAsGRPC(t *testing.T) {
	certDir := t.TempDir()
	ca := tlstest.NewCA(t, certDir, "budget-ca")
	other := tlstest.NewCA(t, certDir, "other-ca")
	srvPair, envoyPair, stranger := ca.Server("ratelimit"), ca.Client("envoy"), other.Client("stranger")
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1000}\n")
	mtls := map[string]string{
		"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": srvPair.CertFile, "GRPC_SERVER_TLS_KEY": srvPair.KeyFile,
		// The start-up facts the subtests read are INFO.
		"GRPC_SERVER_TLS_CA_CERT": ca.CertFile, "LOG_LEVEL": "info",
	}
	envoyTLS, err := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: envoyPair.CertFile, KeyFile: envoyPair.KeyFile, CAFile: ca.CertFile, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	noCertTLS, err := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: ca.CertFile, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	strangerTLS, err := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: stranger.CertFile, KeyFile: stranger.KeyFile, CAFile: ca.CertFile, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	httpsClient := func(c *tls.Config) *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: c}}
	}
	plain := &http.Client{Timeout: 5 * time.Second}
	// probe is the kubelet's HTTPS probe: no client certificate, no verification.
	probe := httpsClient(&tls.Config{InsecureSkipVerify: true})
	// remaining charges the victim 1 hit over gRPC (hits_addend 0 means 1)
	// and returns what is left.
	remaining := func(s *svc) uint32 {
		return call(t, s, req("rl", "user", "victim")).Statuses[0].LimitRemaining
	}
	clientCreds := credentials.NewTLS(envoyTLS)

	t.Run("auto with mTLS: /json off, health open", func(t *testing.T) {
		s := startSvc(t, svcOptions{ConfigDir: dir, Env: mtls, ClientTLS: clientCreds})
		if got := postJSON(t, plain, s.httpURL); got != http.StatusNotFound {
			t.Errorf("plaintext /json: status %d, want 404", got)
		}
		if got := getStatus(t, plain, s.httpURL+"/healthcheck"); got != http.StatusOK {
			t.Errorf("plaintext /healthcheck (kubelet): %d, want 200", got)
		}
		if got := remaining(s); got != 999 {
			t.Errorf("victim remaining %d, want 999 (the gRPC call only): /json charged", got)
		}
		if !strings.Contains(s.logs.String(), "json=off") {
			t.Errorf("start-up log does not say /json is off:\n%s", s.logs.String())
		}
	})

	t.Run("HTTP_JSON=true with mTLS: /json needs a verified client cert", func(t *testing.T) {
		s := startSvc(t, svcOptions{ConfigDir: dir, Env: merge(mtls, map[string]string{"HTTP_JSON": "true"}), ClientTLS: clientCreds})
		httpsURL := strings.Replace(s.httpURL, "http://", "https://", 1)
		if got := postJSON(t, plain, s.httpURL); got == http.StatusOK {
			t.Error("plaintext /json served")
		}
		if got := postJSON(t, httpsClient(noCertTLS), httpsURL); got != http.StatusForbidden {
			t.Errorf("TLS without client cert: /json status %d, want 403", got)
		}
		if got := postJSON(t, httpsClient(strangerTLS), httpsURL); got == http.StatusOK {
			t.Error("client cert of another CA: /json served")
		}
		if got := getStatus(t, probe, httpsURL+"/healthcheck"); got != http.StatusOK {
			t.Errorf("HTTPS probe without client cert: /healthcheck %d, want 200", got)
		}
		if got := remaining(s); got != 999 {
			t.Fatalf("victim remaining %d after refused charges, want 999 (the gRPC call only)", got)
		}
		if got := postJSON(t, httpsClient(envoyTLS), httpsURL); got != http.StatusOK {
			t.Fatalf("verified client cert: /json status %d, want 200", got)
		}
		if got := remaining(s); got != 999-4-1 {
			t.Errorf("victim remaining %d, want %d: exactly the one verified charge of 4", got, 999-4-1)
		}
	})

	t.Run("HTTP_JSON=false without TLS: /json off", func(t *testing.T) {
		s := startSvc(t, svcOptions{ConfigDir: dir, Env: map[string]string{"HTTP_JSON": "false"}})
		if got := postJSON(t, plain, s.httpURL); got != http.StatusNotFound {
			t.Errorf("/json status %d, want 404", got)
		}
	})

	t.Run("no TLS: /json as in the reference", func(t *testing.T) {
		s := startSvc(t, svcOptions{ConfigDir: dir})
		if got := postJSON(t, plain, s.httpURL); got != http.StatusOK {
			t.Fatalf("/json status %d, want 200", got)
		}
		if got := call(t, s, req("rl", "user", "victim")); got.OverallCode != rlpb.RateLimitResponse_OK || got.Statuses[0].LimitRemaining != 1000-4-1 {
			t.Errorf("after one /json charge of 4 and one call: %v", got)
		}
	})
}

// TestDebugExposureIsExplicit: Prometheus keeps its own metrics listener
// (USE_PROMETHEUS, PROMETHEUS_ADDR, as Envoy Gateway sets them) while the
// debug port stays on loopback; binding the debug port beyond loopback is
// a choice the start-up log warns about.
func TestDebugExposureIsExplicit(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", budgetsYAML)
	s := startSvc(t, svcOptions{ConfigDir: dir, Env: map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:0", "LOG_LEVEL": "info"}})
	logs := s.logs.String()
	i := strings.Index(logs, "metrics=")
	if i < 0 || strings.Contains(logs, "debug port exposed") {
		t.Fatalf("start-up log: no metrics address, or a warning for a loopback debug port:\n%s", logs)
	}
	addr := strings.Fields(logs[i+len("metrics="):])[0]
	if got := getStatus(t, &http.Client{Timeout: 5 * time.Second}, "http://"+addr+"/metrics"); got != http.StatusOK {
		t.Errorf("metrics listener %s: %d", addr, got)
	}
	if !strings.HasPrefix(s.debugURL, "http://127.0.0.1:") {
		t.Errorf("debug port %s not on loopback", s.debugURL)
	}
	s.stop()

	exposed := startSvc(t, svcOptions{ConfigDir: dir, Env: map[string]string{"DEBUG_HOST": "0.0.0.0"}})
	if !strings.Contains(exposed.logs.String(), "debug port exposed beyond loopback") {
		t.Errorf("no warning for DEBUG_HOST=0.0.0.0:\n%s", exposed.logs.String())
	}
}
