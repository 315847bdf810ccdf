package monitoring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
	"github.com/budgetgen/budgetgen/internal/ratelimit/service"
	"github.com/budgetgen/budgetgen/internal/syncbuf"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// running is a service started in-process with the example's rate limit
// configs and budget map (examples/).
type running struct {
	debug  string // host:port serving /metrics
	client rlpb.RateLimitServiceClient
	logs   *syncbuf.Buffer
}

func startService(t *testing.T, env map[string]string) *running {
	t.Helper()
	examples, err := filepath.Abs(filepath.Join("..", "..", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	base := map[string]string{"HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0",
		"CONFIG_DIR": filepath.Join(examples, "ratelimit"), "BUDGET_MAP_PATH": filepath.Join(examples, "budget-map.yaml"),
		"XDG_STATE_HOME": t.TempDir()} // the embedded store's default snapshot, this test's own
	for k, v := range env {
		base[k] = v
	}
	logs := &syncbuf.Buffer{}
	ready := make(chan *server.Server, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- service.Run(ctx, nil, func(k string) string { return base[k] }, logs, func(s *server.Server) { ready <- s })
	}()
	var srv *server.Server
	select {
	case srv = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("service exited: %v\n%s", err, logs)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatalf("service did not start\n%s", logs)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("service: %v", err)
		}
	})
	g, _, d, _ := srv.Addrs()
	conn, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &running{debug: d.String(), client: rlpb.NewRateLimitServiceClient(conn), logs: logs}
}

// scrape reads the service's /metrics.
func (r *running) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + r.debug + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// exported lists the sample names of the families (histograms as their
// _bucket, _sum and _count series).
func exported(mfs map[string]*dto.MetricFamily) map[string]bool {
	out := map[string]bool{}
	for name, mf := range mfs {
		out[name] = true
		if mf.GetType() == dto.MetricType_HISTOGRAM || mf.GetType() == dto.MetricType_SUMMARY {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[name+s] = true
			}
		}
	}
	return out
}

// charge sends one agentgateway check-and-charge of the example's per-run
// budget for a run.
func (r *running) charge(t *testing.T, run string, tokens uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := r.client.ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "agents/ai-budgets-agent-gateway", HitsAddend: tokens,
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "budget", Value: "per-run"}, {Key: "principal", Value: run}}}}})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEveryQueriedMetricIsExported: every metric name the dashboard and the
// rules query is on the /metrics of a fresh service, before any traffic:
// with Valkey (and threshold events on), with the embedded store, or with
// its config over xDS, as each store and the xDS source export their own
// series (kube-state-metrics' series excepted); and the example's budget
// names are labels.
func TestEveryQueriedMetricIsExported(t *testing.T) {
	want := queriedMetrics(t)
	vk := valkeytest.Start(t, valkeytest.Options{})
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer sink.Close()
	withValkey := startService(t, map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": vk.Addr, "THRESHOLD_EVENTS_URL": sink.URL,
		"BUDGET_MAP_PATH": reservingMap(t)})
	embedded := startService(t, nil)
	// No xDS server answers: the xDS client's series exist all the same
	// (stream down), and the example's files are served beside it.
	withXDS := startService(t, map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		"CONFIG_GRPC_XDS_SERVER_URL": fmt.Sprintf("127.0.0.1:%d", valkeytest.FreePort(t))})
	got := map[string]bool{}
	for _, r := range []*running{withValkey, embedded, withXDS} {
		mfs := r.scrape(t)
		for n := range exported(mfs) {
			got[n] = true
		}
		checkExampleBudgets(t, mfs)
	}
	var missing []string
	for n := range want {
		// kube-state-metrics' series (the ledger sync CronJob's), not the service's.
		if !got[n] && !strings.HasPrefix(n, "kube_") {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("queried but not exported: %v", missing)
	}
}

// reservingMap writes the example's budget map with a reservation on the
// per-run budget (the example has none), so the reservation series exist.
func reservingMap(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", "budget-map.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m budgetmap.Map
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for i := range m.Entries {
		if m.Entries[i].Budget == "per-run" {
			m.Entries[i].Reserve = &budgetmap.Reserve{Tokens: 20000}
		}
	}
	out, err := yaml.Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := budgetmap.Load(out, "reserving.yaml"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "budget-map.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkExampleBudgets: every budget of the example's budget map labels the
// decision series of a service that has served nothing yet.
func checkExampleBudgets(t *testing.T, mfs map[string]*dto.MetricFamily) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", "budget-map.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := budgetmap.Load(data, "budget-map.yaml")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range mfs["ratelimit_decisions_total"].GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == "budget" && s.GetCounter().GetValue() == 0 {
				seen[l.GetValue()] = true
			}
		}
	}
	for _, e := range m.Entries {
		if !seen[e.Budget] {
			t.Errorf("budget %s is not a label of ratelimit_decisions_total before traffic (seen %v)", e.Budget, seen)
		}
	}
}

// prometheus is a real Prometheus server started by the test.
type prometheus struct {
	url string
	out *syncbuf.Buffer
}

func startPrometheus(t *testing.T, target string) *prometheus {
	t.Helper()
	bin := tool(t, "prometheus")
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %q\nscrape_configs:\n  - job_name: ratelimit\n    static_configs:\n      - targets: [%q]\n", rules, target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", valkeytest.FreePort(t))
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	p := &prometheus{url: "http://" + addr, out: &syncbuf.Buffer{}}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	p.waitFor(t, "Prometheus to be ready", 30*time.Second, func() (bool, error) {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	return p
}

// waitFor polls cond every 200 ms until it holds or timeout passes.
func (p *prometheus) waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s\nprometheus:\n%s", timeout, what, p.out)
		}
		time.Sleep(200 * time.Millisecond) // poll interval
	}
}

// query evaluates an instant query through the HTTP API.
func (p *prometheus) query(q string) ([]struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}, error) {
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", q, r.Error)
	}
	return r.Data.Result, nil
}

// firing returns the firing alerts named name, by their labels.
func (p *prometheus) firing(name string) ([]map[string]string, error) {
	resp, err := http.Get(p.url + "/api/v1/alerts")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&r); err != nil {
		return nil, err
	}
	var out []map[string]string
	for _, a := range r.Data.Alerts {
		if a.Labels["alertname"] == name && a.State == "firing" {
			out = append(out, a.Labels)
		}
	}
	return out, nil
}

// exhaustedExpr is RateLimitBudgetExhausted's expression, from the rule file.
func exhaustedExpr(t *testing.T) string {
	for _, r := range readRules(t) {
		if r.Alert == "RateLimitBudgetExhausted" {
			return r.Expr
		}
	}
	t.Fatal("no RateLimitBudgetExhausted rule")
	return ""
}

// TestPrometheusFiresBudgetExhausted: a real Prometheus loads the shipped
// rules and scrapes a running service with the example's budgets. At 60% of
// the per-run budget's cap the 100% alert's expression is empty and the
// alert quiet; once one run crosses the cap, the expression is true through
// the HTTP API and RateLimitBudgetExhausted fires for budget per-run
// (shadow, so severity warning).
func TestPrometheusFiresBudgetExhausted(t *testing.T) {
	tool(t, "prometheus")
	svc := startService(t, nil)
	prom := startPrometheus(t, svc.debug)
	expr := exhaustedExpr(t)
	const cap = 5_000_000 // per-run's tokensPerDay in examples/budget-map.yaml
	svc.charge(t, "run-7", cap*6/10)
	prom.waitFor(t, "the 60% usage to be scraped", 30*time.Second, func() (bool, error) {
		r, err := prom.query(`max(ratelimit_budget_usage_ratio{budget="per-run"})`)
		return err == nil && len(r) == 1 && r[0].Value[1] == "0.6", err
	})
	if r, err := prom.query(expr); err != nil || len(r) != 0 {
		t.Fatalf("at 60%% the 100%% expression returned %v (%v)", r, err)
	}
	if a, err := prom.firing("RateLimitBudgetExhausted"); err != nil || len(a) != 0 {
		t.Fatalf("at 60%%: firing %v (%v)", a, err)
	}
	svc.charge(t, "run-7", cap*4/10)
	prom.waitFor(t, "the 100% expression to be true", 30*time.Second, func() (bool, error) {
		r, err := prom.query(expr)
		return err == nil && len(r) == 1 && r[0].Metric["budget"] == "per-run" && r[0].Value[1] == "1", err
	})
	prom.waitFor(t, "RateLimitBudgetExhausted to fire", 30*time.Second, func() (bool, error) {
		a, err := prom.firing("RateLimitBudgetExhausted")
		return err == nil && len(a) == 1 && a[0]["budget"] == "per-run" && a[0]["mode"] == "shadow" && a[0]["severity"] == "warning" &&
			a[0]["gateway"] == "agentgateway:agents/agent-gateway", err
	})
	if a, err := prom.firing("RateLimitBudgetAt90Percent"); err != nil || len(a) != 1 {
		t.Fatalf("90%% alert: %v (%v)", a, err)
	}
	if strings.Contains(svc.logs.String(), "level=ERROR") {
		t.Fatalf("service errors:\n%s", svc.logs)
	}
}
