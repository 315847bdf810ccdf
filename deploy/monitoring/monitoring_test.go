// Package monitoring_test checks what deploy/monitoring ships (the
// dashboard, alert rules and ServiceMonitor of the rate limit service;
// docs/monitoring.md) against the real tools and the real service: promtool
// checks and unit-tests the rules, a real Prometheus scrapes a running
// service and fires an alert, and every metric the dashboard and the rules
// query must be exported.
package monitoring_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/budgetgen/budgetgen/internal/monitoring"
	"github.com/budgetgen/budgetgen/internal/store/valkey"
)

var update = flag.Bool("update", false, "rewrite dashboard.json and prometheusrule.yaml")

const (
	rulesFile     = "ratelimit.rules.yaml"
	rulesTestFile = "ratelimit.rules_test.yaml"
	runbookBase   = "https://github.com/budgetgen/budgetgen/blob/main/docs/runbook.md#"
)

// tool returns the path of a Prometheus program, failing the test when
// CI=true and it is missing, skipping it otherwise.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := fmt.Sprintf("%s not found on PATH; run hack/install-deps.sh (Debian's prometheus package)", name)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func readRules(t *testing.T) []rule {
	t.Helper()
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	var out []rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// TestGeneratedFilesAreCurrent: dashboard.json is what internal/monitoring
// builds and prometheusrule.yaml wraps the rule file; -update rewrites them.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	dash, err := monitoring.DashboardJSON()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := monitoring.PrometheusRule(rules, rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]byte{"dashboard.json": dash, "prometheusrule.yaml": pr} {
		if *update {
			if err := os.WriteFile(name, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale; run go test ./deploy/monitoring -run TestGeneratedFilesAreCurrent -update", name)
		}
	}
	// The PrometheusRule holds exactly the rule file's groups.
	var wrapped struct {
		Spec struct {
			Groups any `yaml:"groups"`
		} `yaml:"spec"`
	}
	var plain struct {
		Groups any `yaml:"groups"`
	}
	if yaml.Unmarshal(pr, &wrapped) != nil || yaml.Unmarshal(rules, &plain) != nil || fmt.Sprint(wrapped.Spec.Groups) != fmt.Sprint(plain.Groups) {
		t.Fatal("prometheusrule.yaml's groups differ from the rule file's")
	}
}

// TestPromtoolChecksAndTestsTheRules: promtool check rules and promtool test
// rules (the unit tests) pass on the shipped files, and the generated
// PrometheusRule's groups pass promtool check too.
func TestPromtoolChecksAndTestsTheRules(t *testing.T) {
	promtool := tool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// A broken unit test must fail, or the run above proves nothing.
	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	broken := bytes.Replace(b, []byte("severity: critical, budget: per-human"), []byte("severity: info, budget: per-human"), 1)
	rules, _ := os.ReadFile(rulesFile)
	if err := os.WriteFile(filepath.Join(dir, rulesTestFile), broken, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, rulesFile), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "test", "rules", rulesTestFile)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err == nil || bytes.Equal(broken, b) {
		t.Fatalf("promtool passed a wrong expectation:\n%s", out)
	}
}

// TestEveryAlertIsUnitTestedAndHasARunbook: every alert has a unit test that
// expects it firing and one that expects it quiet, a severity, a summary,
// and a runbook_url to its section of docs/runbook.md, which exists.
func TestEveryAlertIsUnitTestedAndHasARunbook(t *testing.T) {
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &tests); err != nil {
		t.Fatal(err)
	}
	firing, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	runbook, err := os.ReadFile(filepath.Join("..", "..", "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	rules := readRules(t)
	if len(rules) < 12 {
		t.Fatalf("%d alerts", len(rules))
	}
	for _, r := range rules {
		if !firing[r.Alert] || !quiet[r.Alert] {
			t.Errorf("%s: unit tests expect it firing %t, quiet %t; want both", r.Alert, firing[r.Alert], quiet[r.Alert])
		}
		if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: severity, summary or description missing", r.Alert)
		}
		if want := runbookBase + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
		}
		if !bytes.Contains(runbook, []byte("\n## "+r.Alert+"\n")) {
			t.Errorf("docs/runbook.md has no section \"## %s\"", r.Alert)
		}
	}
}

// TestOutageBufferThresholdFollowsTheStore: the near-full alert fires at 80%
// of the Valkey store's buffer bound.
func TestOutageBufferThresholdFollowsTheStore(t *testing.T) {
	want := "> " + strconv.Itoa(valkey.DefaultBufferMaxKeys*8/10)
	for _, r := range readRules(t) {
		if r.Alert == "RateLimitOutageBufferNearFull" && !strings.HasSuffix(strings.TrimSpace(r.Expr), want) {
			t.Fatalf("%s: %q does not end with %q", r.Alert, r.Expr, want)
		}
	}
}

// TestKustomizeBuild: the kustomization renders the PrometheusRule, the
// ServiceMonitor of Envoy Gateway's rate limit Service and the dashboard
// ConfigMap (label grafana_dashboard, the JSON byte for byte).
func TestKustomizeBuild(t *testing.T) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), ".")
	if err != nil {
		t.Fatal(err)
	}
	dash, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, r := range res.Resources() {
		kinds[r.GetKind()+"/"+r.GetName()] = true
		if r.GetKind() != "ConfigMap" {
			continue
		}
		data := r.GetDataMap()
		if r.GetLabels()["grafana_dashboard"] != "1" || data["budgetgen-ratelimit.json"] != string(dash) {
			t.Errorf("dashboard ConfigMap: labels %v, %d bytes of JSON", r.GetLabels(), len(data["budgetgen-ratelimit.json"]))
		}
	}
	for _, want := range []string{"PrometheusRule/" + monitoring.PrometheusRuleName, "ServiceMonitor/budgetgen-ratelimit", "ConfigMap/budgetgen-ratelimit-dashboard"} {
		if !kinds[want] {
			t.Errorf("kustomize build lacks %s (has %v)", want, kinds)
		}
	}
}

// queriedMetrics returns every metric name the shipped dashboard (panel
// targets and variable queries) and rules query.
func queriedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	var exprs []string
	for _, r := range readRules(t) {
		exprs = append(exprs, r.Expr)
	}
	b, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	labelValues := regexp.MustCompile(`^label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if e, ok := v["expr"].(string); ok {
				exprs = append(exprs, e)
			}
			if q, ok := v["query"].(string); ok && v["type"] == "query" {
				m := labelValues.FindStringSubmatch(q)
				if m == nil {
					t.Fatalf("variable query %q is not label_values(expr, label)", q)
				}
				exprs = append(exprs, m[1])
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(d)
	names := map[string]bool{}
	for _, e := range exprs {
		ns, err := monitoring.MetricNames(e)
		if err != nil {
			t.Fatalf("%q: %v", e, err)
		}
		for _, n := range ns {
			names[n] = true
		}
	}
	if len(exprs) < 30 || len(names) < 25 {
		t.Fatalf("only %d expressions, %d metric names: the walk missed some", len(exprs), len(names))
	}
	return names
}

// TestLedgerSyncStaleAlertWatchesTheCronJob: an alert watches the last
// success of the ledger sync CronJob deploy/ledger-sync ships, by its name,
// through kube-state-metrics (the sync exports no metrics of its own: it is a
// Job that exits), and one also covers a CronJob that never succeeded, which
// kube-state-metrics reports no last success time for.
func TestLedgerSyncStaleAlertWatchesTheCronJob(t *testing.T) {
	assertCronJobWatched(t, filepath.Join("..", "ledger-sync", "cronjob.yaml"))
}

// TestReportStaleAlertWatchesTheCronJob: likewise for the weekly report
// CronJob deploy/report ships, whose Jobs exit too.
func TestReportStaleAlertWatchesTheCronJob(t *testing.T) {
	assertCronJobWatched(t, filepath.Join("..", "report", "cronjob.yaml"))
}

// assertCronJobWatched fails unless one alert reads both the last success
// time and the creation time of the CronJob in file, selected by its name.
func assertCronJobWatched(t *testing.T, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cj struct {
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
	}
	if err := yaml.Unmarshal(b, &cj); err != nil || cj.Metadata.Name == "" {
		t.Fatalf("%s: name %q, %v", file, cj.Metadata.Name, err)
	}
	sel := `{cronjob="` + cj.Metadata.Name + `"}`
	for _, r := range readRules(t) {
		if strings.Contains(r.Expr, "kube_cronjob_status_last_successful_time"+sel) &&
			strings.Contains(r.Expr, "kube_cronjob_created"+sel) {
			return
		}
	}
	t.Fatalf("no alert reads kube_cronjob_status_last_successful_time%s and kube_cronjob_created%s", sel, sel)
}
