package deploy

import (
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/budgetgen/budgetgen/internal/tlsconfig/tlstest"
)

// probe does what the kubelet does for one try of p: an HTTP GET
// (success: 200-399) or a TCP connect, to the pod's named port.
func probe(p *corev1.Probe, ports map[string]net.Addr) error {
	var port string
	switch {
	case p.HTTPGet != nil:
		port = p.HTTPGet.Port.StrVal
	case p.TCPSocket != nil:
		port = p.TCPSocket.Port.StrVal
	default:
		return fmt.Errorf("probe %+v: neither httpGet nor tcpSocket on a named port", p.ProbeHandler)
	}
	addr, ok := ports[port]
	if !ok {
		return fmt.Errorf("probe names port %q, which the service does not open", port)
	}
	if p.TCPSocket != nil {
		c, err := net.DialTimeout("tcp", addr.String(), time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	}
	scheme, client := "http", &http.Client{Timeout: time.Second}
	if p.HTTPGet.Scheme == corev1.URISchemeHTTPS {
		// The kubelet does not verify the certificate and presents none.
		scheme = "https"
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // as the kubelet's probes
	}
	resp, err := client.Get(scheme + "://" + addr.String() + p.HTTPGet.Path)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("GET %s: %s", p.HTTPGet.Path, resp.Status)
	}
	return nil
}

// startChartPod starts the service as the chart's Deployment (rendered
// with the example values and --set each of set) runs it: its env, the
// Secrets its Certificates create and its ConfigMaps, mounted where it
// mounts them. env changes the pod's environment first. It returns the
// Deployment and the service's ports by container port name.
func startChartPod(t *testing.T, env map[string]string, set ...string) (*appsv1.Deployment, map[string]net.Addr) {
	t.Helper()
	dep, certs := chartObjects(t, set...)
	c := issueChartSecrets(t, certs)
	for secret, path := range secretMounts(dep) {
		if _, ok := c.secrets[secret]; ok {
			c.mount(t, secret, path)
		}
	}
	mountConfigMaps(t, dep, c.root)
	podenv := podEnv(dep, c.root)
	maps.Copy(podenv, env)
	if f := podenv["REDIS_AUTH_FILE"]; f != "" && podenv["REDIS_URL"] != "" {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		tlstest.WriteFile(t, f, []byte("secret"))
	}
	if podenv["REDIS_URL"] == "" {
		delete(podenv, "REDIS_AUTH_FILE") // the embedded store: no Valkey password
	}
	g, h, _, m := startChartServer(t, podenv).Addrs()
	return dep, map[string]net.Addr{"grpc": g, "http": h, "metrics": m}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestChartProbesWhileValkeyUnreachable starts the service as the chart's
// Deployment runs it (its env, certificates and ConfigMaps) with Valkey
// unreachable, as after a node loss that took Valkey with it, and runs the
// Deployment's probes against it: readiness fails (the pod leaves the
// Service's endpoints until Valkey answers), liveness passes. A liveness
// probe on /healthcheck would fail too and the kubelet would restart the
// pod, dropping the outage buffer's charges (docs/runbook.md,
// RateLimitOutageBufferFilling: do not restart while it holds charges) and
// never letting it reach Valkey's return.
func TestChartProbesWhileValkeyUnreachable(t *testing.T) {
	dep, ports := startChartPod(t, map[string]string{"REDIS_URL": closedAddr(t)})
	ctr := dep.Spec.Template.Spec.Containers[0]
	if ctr.ReadinessProbe == nil || ctr.LivenessProbe == nil {
		t.Fatal("the chart's container has no readiness or no liveness probe")
	}
	if err := probe(ctr.ReadinessProbe, ports); err == nil {
		t.Error("readiness passes with Valkey unreachable since start: the pod would take traffic it cannot count")
	}
	// Past the liveness probe's whole window (initial delay and its failures)
	// the pod must still be alive: every try succeeds.
	for i := 0; i < 3; i++ {
		if err := probe(ctr.LivenessProbe, ports); err != nil {
			t.Fatalf("liveness fails with Valkey unreachable (%v): the kubelet would restart the pod and drop its buffered charges", err)
		}
	}
}

// TestChartProbesWithJSONOverTLS: with tls.mode mutual and env.HTTP_JSON
// true the service serves its HTTP port over TLS (/json then asks for the
// client certificate), so the probes must speak HTTPS to it or the pod is
// never ready. On the embedded store (the test's), ready at once.
func TestChartProbesWithJSONOverTLS(t *testing.T) {
	for _, set := range [][]string{nil, {"env.HTTP_JSON=true"}, {"env.HTTP_JSON=false"}} {
		dep, ports := startChartPod(t, nil, set...)
		ctr := dep.Spec.Template.Spec.Containers[0]
		if err := probe(ctr.ReadinessProbe, ports); err != nil {
			t.Errorf("--set %v: readiness fails on a ready service: %v", set, err)
		}
		if err := probe(ctr.LivenessProbe, ports); err != nil {
			t.Errorf("--set %v: liveness fails: %v", set, err)
		}
	}
}
