package deploy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/wrapperspb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
	"github.com/budgetgen/budgetgen/internal/ratelimit/service"
	"github.com/budgetgen/budgetgen/internal/tlsconfig/tlstest"
	bgrender "github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// chartObjects renders the chart with the example values (and --set each
// of set) and returns the Deployment and the cert-manager Certificates (as
// plain maps).
func chartObjects(t *testing.T, set ...string) (*appsv1.Deployment, []map[string]any) {
	t.Helper()
	var dep *appsv1.Deployment
	var certs []map[string]any
	args := []string{"template", "budgetgen-ratelimit", chartDir, "--namespace", namespace, "--values", exampleValues}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	for _, doc := range splitDocs(t, runHelm(t, args...)) {
		var m map[string]any
		if err := sigsyaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		switch m["kind"] {
		case "Deployment":
			dep = &appsv1.Deployment{}
			strict(t, "Deployment", doc, dep)
		case "Certificate":
			certs = append(certs, m)
		}
	}
	if dep == nil {
		t.Fatal("the chart renders no Deployment")
	}
	return dep, certs
}

// secretMounts maps each Secret volume of the pod to its mount path.
func secretMounts(dep *appsv1.Deployment) map[string]string {
	out := map[string]string{}
	pod := dep.Spec.Template.Spec
	for _, v := range pod.Volumes {
		if v.Secret == nil {
			continue
		}
		for _, m := range pod.Containers[0].VolumeMounts {
			if m.Name == v.Name {
				out[v.Secret.SecretName] = m.MountPath
			}
		}
	}
	return out
}

// cluster is what cert-manager and the kubelet would make of the chart: the
// Secrets its Certificates ask for, issued by one CA (cert-manager writes
// tls.crt, tls.key and the issuing CA's ca.crt), and files at the paths the
// Deployment mounts them, under root.
type cluster struct {
	root    string
	secrets map[string]map[string][]byte
}

func issueChartSecrets(t *testing.T, certs []map[string]any) *cluster {
	t.Helper()
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "budgetgen-ca")
	caPEM, err := os.ReadFile(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{root: t.TempDir(), secrets: map[string]map[string][]byte{}}
	for _, cert := range certs {
		s := cert["spec"].(map[string]any)
		if s["isCA"] == true {
			continue
		}
		secret := s["secretName"].(string)
		usages := strings.Join(toStrings(s["usages"]), ",")
		var pair tlstest.Pair
		switch {
		case strings.Contains(usages, "server auth"):
			names := toStrings(s["dnsNames"])
			pair = ca.ServerNamed(names...) // the chart's names, no address: as cert-manager issues it
		case strings.Contains(usages, "client auth"):
			pair = ca.Client(secret)
		default:
			t.Fatalf("Certificate %s has neither server nor client auth usage: %s", secret, usages)
		}
		crt, _ := os.ReadFile(pair.CertFile)
		key, _ := os.ReadFile(pair.KeyFile)
		c.secrets[secret] = map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": caPEM}
	}
	return c
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// mount writes a Secret's keys where the pod mounts it, below c.root.
func (c *cluster) mount(t *testing.T, secret, path string) {
	t.Helper()
	data, ok := c.secrets[secret]
	if !ok {
		t.Fatalf("the pod mounts Secret %s, which no Certificate of the chart creates", secret)
	}
	dir := filepath.Join(c.root, path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range data {
		tlstest.WriteFile(t, filepath.Join(dir, k), v)
	}
}

// podEnv is the container's environment as the chart sets it, with every
// path under a volume mount moved below root and values from Secrets left
// out (REDIS_URL: the test runs on the embedded store). Ports and hosts are
// loopback and free; SHUTDOWN_DELAY is 0s (TestChartGracePeriodCoversTheStop
// checks the chart's).
func podEnv(dep *appsv1.Deployment, root string) map[string]string {
	env := map[string]string{}
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom != nil {
			continue
		}
		v := e.Value
		for _, m := range dep.Spec.Template.Spec.Containers[0].VolumeMounts {
			if v == m.MountPath || strings.HasPrefix(v, m.MountPath+"/") {
				v = filepath.Join(root, v)
				break
			}
		}
		env[e.Name] = v
	}
	for k, v := range map[string]string{"PORT": "0", "GRPC_PORT": "0", "DEBUG_PORT": "0", "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1",
		"DEBUG_HOST": "127.0.0.1", "PROMETHEUS_ADDR": "127.0.0.1:0", "XDG_STATE_HOME": root,
		"SHUTDOWN_DELAY": "0s"} { // the chart's delay serves no caller here: each test's stop would wait it out
		env[k] = v
	}
	return env
}

// TestChartTLSWithRenderedPolicy starts the service with the chart's
// certificate layout (the Secrets its Certificates create, mounted where
// its Deployment mounts them, with its TLS settings) and its ConfigMaps
// (the rate limit config and the budget map, as the chart renders them,
// mounted where the Deployment mounts them), and connects as
// agentgateway would with the backend TLS policy render emits for the
// example spec: its client certificate and CA from the Secrets the policy
// names, the policy's SNI as the server name (else the endpoint's address,
// as agentgateway does), ALPN h2. That client is answered; one without a
// client certificate is refused.
func TestChartTLSWithRenderedPolicy(t *testing.T) {
	dep, certs := chartObjects(t)
	c := issueChartSecrets(t, certs)
	for secret, path := range secretMounts(dep) {
		if _, ok := c.secrets[secret]; ok {
			c.mount(t, secret, path)
		}
	}
	env := podEnv(dep, c.root)
	for _, k := range []string{"GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_SERVER_TLS_CA_CERT", "CONFIG_DIR", "BUDGET_MAP_PATH"} {
		if env[k] == "" {
			t.Fatalf("the chart does not set %s", k)
		}
	}
	mountConfigMaps(t, dep, c.root)
	grpcAddr := startChartService(t, env)

	bs, err := spec.LoadFile("../examples/budgets.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := bgrender.Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	var pol *agentgateway.Policy
	for _, o := range res.Objects {
		if p, ok := agentgateway.Model(o.Object).(*agentgateway.Policy); ok && p.Spec.Backend != nil {
			pol = p
		}
	}
	if pol == nil || pol.Spec.Backend.TLS == nil {
		t.Fatal("render emits no backend TLS policy for the example")
	}
	rs := bs.Spec.RateLimitService
	if rs.Name != dep.Name || rs.Namespace != namespace {
		t.Fatalf("the spec's rateLimitService %s/%s is not the chart's Service %s/%s", rs.Namespace, rs.Name, namespace, dep.Name)
	}
	// agentgateway connects to a Service's endpoints by address
	// (build_service_call in crates/agentgateway/src/proxy/httpproxy.rs:
	// Target::Address of the workload IP) and, without backend.tls.sni,
	// sends and verifies that IP as the server name (handshake in
	// crates/agentgateway/src/client/tls.rs).
	host, _, err := net.SplitHostPort(grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	if sni := pol.Spec.Backend.TLS.SNI; sni != "" {
		host = sni
	}
	tlsCfg := agentgatewayTLS(t, c, pol.Spec.Backend.TLS, host)
	if err := shouldRateLimit(grpcAddr, tlsCfg); err != nil {
		t.Fatalf("agentgateway with the rendered TLS settings is refused: %v", err)
	}
	noCert := tlsCfg.Clone()
	noCert.Certificates = nil
	if err := shouldRateLimit(grpcAddr, noCert); err == nil {
		t.Fatal("a client without a client certificate was answered")
	}
}

// agentgatewayTLS is the client side of backend.tls as agentgateway reads
// it: tls.crt and tls.key of the mtlsCertificateRef Secret, ca.crt of the
// caCertificateRefs object, host the server name it sends and verifies,
// ALPN h2 and http/1.1 (the CRD's default).
func agentgatewayTLS(t *testing.T, c *cluster, bt *agentgateway.BackendTLS, host string) *tls.Config {
	t.Helper()
	if len(bt.MtlsCertificateRef) != 1 || len(bt.CACertificateRefs) != 1 || bt.CACertificateRefs[0].Kind != agentgateway.CAKindSecret {
		t.Fatalf("backend.tls = %+v, want one client Secret and one CA Secret", bt)
	}
	client, ok := c.secrets[bt.MtlsCertificateRef[0].Name]
	if !ok {
		t.Fatalf("mtlsCertificateRef names Secret %s, which the chart's Certificates do not create", bt.MtlsCertificateRef[0].Name)
	}
	caSecret, ok := c.secrets[bt.CACertificateRefs[0].Name]
	if !ok {
		t.Fatalf("caCertificateRefs names Secret %s, which the chart's Certificates do not create", bt.CACertificateRefs[0].Name)
	}
	pair, err := tls.X509KeyPair(client[agentgateway.KeyTLSCert], client[agentgateway.KeyTLSKey])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caSecret[agentgateway.KeyCACert]) {
		t.Fatal("ca.crt holds no certificate")
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots, ServerName: host, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12}
}

// chartConfigMaps renders the chart with the example values and returns
// the data of each ConfigMap it creates, by name.
func chartConfigMaps(t *testing.T) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for _, doc := range splitDocs(t, helmTemplate(t, exampleValues)) {
		var cm corev1.ConfigMap
		if err := sigsyaml.Unmarshal(doc, &cm); err != nil {
			t.Fatal(err)
		}
		if cm.Kind == "ConfigMap" {
			out[cm.Name] = cm.Data
		}
	}
	return out
}

// mountConfigMaps lays out, below root, every ConfigMap volume of the pod
// where its container mounts it, with the data the chart renders: what the
// kubelet would give the pod.
func mountConfigMaps(t *testing.T, dep *appsv1.Deployment, root string) {
	t.Helper()
	cms := chartConfigMaps(t)
	pod := dep.Spec.Template.Spec
	for _, v := range pod.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		data, ok := cms[v.ConfigMap.Name]
		if !ok {
			t.Fatalf("the pod mounts ConfigMap %s, which the chart does not create", v.ConfigMap.Name)
		}
		for _, m := range pod.Containers[0].VolumeMounts {
			if m.Name != v.Name {
				continue
			}
			for key, body := range data {
				writeConfigMap(t, filepath.Join(root, m.MountPath), key, []byte(body))
			}
		}
	}
}

// writeConfigMap lays a key out as the kubelet mounts a ConfigMap key: the
// data in a timestamped directory, ..data linking to it, and the key a link
// through ..data (the service must follow the link and skip the dot entries).
func writeConfigMap(t *testing.T, dir, key string, data []byte) {
	t.Helper()
	ts := filepath.Join(dir, "..2026_12_01_00_00_00.000000001")
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	tlstest.WriteFile(t, filepath.Join(ts, key), data)
	if _, err := os.Lstat(filepath.Join(dir, "..data")); os.IsNotExist(err) {
		if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join("..data", key), filepath.Join(dir, key)); err != nil {
		t.Fatal(err)
	}
}

func startChartService(t *testing.T, env map[string]string) string {
	t.Helper()
	srv, _ := startChartServer(t, env)
	g, _, _, _ := srv.Addrs()
	return g.String()
}

// startChartServer runs the service with env until the test ends and
// returns it once it listens, with its log.
func startChartServer(t *testing.T, env map[string]string) (*server.Server, *syncWriter) {
	t.Helper()
	ready := make(chan *server.Server, 1)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncWriter{}
	go func() {
		done <- service.Run(ctx, nil, func(k string) string { return env[k] }, logs, func(s *server.Server) { ready <- s })
	}()
	var srv *server.Server
	select {
	case srv = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("service exited: %v\n%s", err, logs)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatalf("service did not start\n%s", logs)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return srv, logs
}

// shouldRateLimit makes agentgateway's request-time call for per-run.
func shouldRateLimit(addr string, cfg *tls.Config) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := &rlcommon.RateLimitDescriptor{
		Entries:    []*rlcommon.RateLimitDescriptor_Entry{{Key: "budget", Value: "per-run"}, {Key: "principal", Value: "run-1"}},
		HitsAddend: wrapperspb.UInt64(0),
	}
	resp, err := rlpb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "agents/ai-budgets-agent-gateway", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
	if err != nil {
		return err
	}
	if resp.OverallCode != rlpb.RateLimitResponse_OK || len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit == nil {
		return &unexpected{resp: resp}
	}
	return nil
}

type unexpected struct{ resp *rlpb.RateLimitResponse }

func (u *unexpected) Error() string {
	return "answer without the per-run limit (config not loaded?): " + u.resp.String()
}

// syncWriter collects the service's log lines for a failure message.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
