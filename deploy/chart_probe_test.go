package deploy

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/budgetgen/budgetgen/internal/ratelimit/service"
	"github.com/budgetgen/budgetgen/internal/tlsconfig/tlstest"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
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

// runningPod is the service started as the chart's Deployment runs it.
type runningPod struct {
	dep   *appsv1.Deployment
	ports map[string]net.Addr // by container port name
	logs  *syncWriter
}

// startChartPod starts the service as the chart's Deployment (rendered
// with the example values and --set each of set) runs it: its env, the
// Secrets its Certificates create, the user's Secrets (userSecrets, by
// name and key; the kubelet's items mapping applied) and its ConfigMaps,
// mounted where it mounts them. env changes the pod's environment first.
func startChartPod(t *testing.T, env map[string]string, userSecrets map[string]map[string][]byte, set ...string) runningPod {
	t.Helper()
	dep, podenv := preparePod(t, env, userSecrets, set...)
	srv, logs := startChartServer(t, podenv)
	g, h, _, m := srv.Addrs()
	return runningPod{dep: dep, ports: map[string]net.Addr{"grpc": g, "http": h, "metrics": m}, logs: logs}
}

// preparePod lays out the pod's files as startChartPod describes and
// returns the Deployment and the container's environment.
func preparePod(t *testing.T, env map[string]string, userSecrets map[string]map[string][]byte, set ...string) (*appsv1.Deployment, map[string]string) {
	t.Helper()
	dep, certs := chartObjects(t, set...)
	c := issueChartSecrets(t, certs)
	for secret, path := range secretMounts(dep) {
		if _, ok := c.secrets[secret]; ok {
			c.mount(t, secret, path)
		}
	}
	mountUserSecrets(t, dep, c.root, userSecrets)
	mountConfigMaps(t, dep, c.root)
	podenv := podEnv(dep, c.root)
	maps.Copy(podenv, env)
	if _, err := os.Stat(podenv["REDIS_AUTH_FILE"]); err != nil {
		delete(podenv, "REDIS_AUTH_FILE") // no Valkey Secret given: the embedded store
	}
	return dep, podenv
}

// mountUserSecrets writes, below root, the keys of each given Secret that
// the pod mounts, as the kubelet does: every key, or only the volume's
// items under their paths.
func mountUserSecrets(t *testing.T, dep *appsv1.Deployment, root string, secrets map[string]map[string][]byte) {
	t.Helper()
	pod := dep.Spec.Template.Spec
	for _, v := range pod.Volumes {
		data, ok := secrets[secretName(v)]
		if !ok {
			continue
		}
		files := map[string][]byte{}
		for k, b := range data {
			files[k] = b
		}
		if len(v.Secret.Items) > 0 {
			files = map[string][]byte{}
			for _, it := range v.Secret.Items {
				files[it.Path] = data[it.Key]
			}
		}
		for _, m := range pod.Containers[0].VolumeMounts {
			if m.Name != v.Name {
				continue
			}
			for name, b := range files {
				p := filepath.Join(root, m.MountPath, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				tlstest.WriteFile(t, p, b)
			}
		}
	}
}

func secretName(v corev1.Volume) string {
	if v.Secret == nil {
		return ""
	}
	return v.Secret.SecretName
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
	p := startChartPod(t, map[string]string{"REDIS_URL": closedAddr(t)}, nil)
	dep, ports := p.dep, p.ports
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
		p := startChartPod(t, nil, nil, set...)
		dep, ports := p.dep, p.ports
		ctr := dep.Spec.Template.Spec.Containers[0]
		if err := probe(ctr.ReadinessProbe, ports); err != nil {
			t.Errorf("--set %v: readiness fails on a ready service: %v", set, err)
		}
		if err := probe(ctr.LivenessProbe, ports); err != nil {
			t.Errorf("--set %v: liveness fails: %v", set, err)
		}
	}
}

// TestChartValkeyPasswordFromSecret runs the chart's pod against a real
// Valkey that requires a password, given only as the chart takes it: a key
// of the Secret valkey.secretName, mounted as a file (REDIS_AUTH_FILE). The
// pod becomes ready (it authenticated); with a wrong password the service
// stops at start saying so; and the password is in neither the Deployment
// nor the service's log or error.
func TestChartValkeyPasswordFromSecret(t *testing.T) {
	const password = "s3cret-only-in-the-Secret"
	vk := valkeytest.Start(t, valkeytest.Options{})
	if _, err := vk.Do("CONFIG", "SET", "requirepass", password); err != nil { // after Start's unauthenticated readiness check
		t.Fatal(err)
	}
	secret := func(pw string) map[string]map[string][]byte {
		return map[string]map[string][]byte{"budgetgen-valkey": {"url": []byte(vk.Addr), "password": []byte(pw + "\n")}}
	}
	p := startChartPod(t, map[string]string{"REDIS_URL": vk.Addr}, secret(password))
	readiness := p.dep.Spec.Template.Spec.Containers[0].ReadinessProbe
	err := probe(readiness, p.ports)
	for i := 0; err != nil && i < 50; i++ {
		time.Sleep(100 * time.Millisecond) // the first connection is made in the background
		err = probe(readiness, p.ports)
	}
	if err != nil {
		t.Errorf("not ready with the Secret's password: %v\n%s", err, p.logs)
	}
	dep, err := sigsyaml.Marshal(p.dep)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(dep), password) || strings.Contains(p.logs.String(), password) {
		t.Error("the Valkey password is in the Deployment or the service's log")
	}

	wrong := "not-" + password
	_, env := preparePod(t, map[string]string{"REDIS_URL": vk.Addr}, secret(wrong))
	logs := &syncWriter{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = service.Run(ctx, nil, func(k string) string { return env[k] }, logs, nil)
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("with a wrong password: Run = %v, want a start-up error saying WRONGPASS", err)
	}
	if err != nil && strings.Contains(err.Error()+logs.String(), wrong) {
		t.Error("the wrong password is in the start-up error or the log")
	}
}
