package source

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
)

const agwFile = `domain: agents/s-agw
descriptors:
  - key: budget
    value: per-key
    descriptors:
      - key: principal
        rate_limit: {unit: day, requests_per_unit: 1000}
      - key: principal
        value: vip
        rate_limit: {unit: day, requests_per_unit: 5000}
`

func egProto(domain string) []*rlsconfv3.RateLimitConfig {
	rule := domain + "/rule/0"
	return []*rlsconfv3.RateLimitConfig{{Name: domain, Domain: domain, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: rule, Value: rule, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key:       "rule-0-match-0",
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 1000},
		}},
	}}}}
}

func writeDir(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// xDS and files are merged; a bad update of either keeps the other's
// domains and its own last good ones.
func TestApplierMergesXDSAndFilesEachValidatedAlone(t *testing.T) {
	dir := t.TempDir()
	writeDir(t, dir, "agw.yaml", agwFile)
	s := &sink{}
	a := &Applier{Sink: s, Logger: quiet()}
	files := &Files{Dir: config.DirOptions{Root: dir}}
	if err := files.Load(a); err != nil {
		t.Fatal(err)
	}
	if err := a.ApplyProto(t.Context(), egProto("gw/s-gw1")); err != nil {
		t.Fatal(err)
	}
	domains := func() string { c, _ := s.get(); return strings.Join(c.Domains(), ",") }
	if got := domains(); got != "agents/s-agw,gw/s-gw1" {
		t.Fatalf("merged domains = %s", got)
	}
	// A broken file: rejected, xDS config and the last good file stay.
	writeDir(t, dir, "agw.yaml", "domain: agents/s-agw\ndescriptors: [{key: budget, rate_limit: {unit: fortnight}}]\n")
	if err := files.Load(a); err == nil {
		t.Fatal("broken file accepted")
	}
	if got := domains(); got != "agents/s-agw,gw/s-gw1" {
		t.Errorf("after a bad file: %s", got)
	}
	// A bad xDS update (NACKed) keeps the files.
	bad := egProto("gw/s-gw1")
	bad[0].Descriptors[0].Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
	if err := a.ApplyProto(t.Context(), bad); err == nil {
		t.Fatal("bad xDS config accepted")
	}
	if got := domains(); got != "agents/s-agw,gw/s-gw1" {
		t.Errorf("after a bad xDS update: %s", got)
	}
	// A domain in both sources cannot be merged: the update that causes it is
	// rejected (xDS NACKs it) and the config in force is unchanged.
	if err := a.ApplyProto(t.Context(), egProto("agents/s-agw")); err == nil || !strings.Contains(err.Error(), "duplicate domain 'agents/s-agw'") {
		t.Fatalf("duplicate domain across sources: err = %v", err)
	}
	if got := domains(); got != "agents/s-agw,gw/s-gw1" {
		t.Errorf("after a conflicting xDS update: %s", got)
	}
}

const mapFile = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetMap
budgetSet: s
entries:
  - domain: agents/s-agw
    descriptor: [{key: budget, value: per-key}, {key: principal}]
    gateway: {kind: agentgateway, namespace: agents, name: agw}
    budget: per-key
    bucket: s/per-key
    kind: tokens
    principal: {expression: 'string(jwt["sub"])'}
    tokensPerDay: 1000
    window: day
    mode: enforce
  - domain: agents/s-agw
    descriptor: [{key: budget, value: per-key}, {key: principal, value: vip}]
    gateway: {kind: agentgateway, namespace: agents, name: agw}
    budget: per-key
    bucket: s/per-key
    kind: tokens
    principal: {expression: 'string(jwt["sub"])'}
    overridePrincipal: vip
    tokensPerDay: 5000
    window: day
    mode: enforce
  - domain: gw/s-gw1
    descriptor: [{key: gw/s-gw1/rule/0, value: gw/s-gw1/rule/0}]
    gateway: {kind: envoy, namespace: gw, name: gw1}
    budget: per-key
    bucket: s/per-key
    kind: tokens
    principal: {header: x-user}
    tokensPerDay: 1000
    window: day
    mode: enforce
`

func scopes(c *config.Config) map[string]string {
	out := map[string]string{}
	for _, l := range c.Limits() {
		v := "-"
		if l.Scope != nil {
			v = l.Scope.Bucket
			if l.Scope.Fixed {
				v += " fixed " + l.Scope.Principal
			}
		}
		out[l.Rule] = v
	}
	return out
}

// The budget map scopes the limits it names, is hot-reloaded, and a bad map
// keeps the last good one.
func TestBudgetMapScopesAndReloads(t *testing.T) {
	dir := t.TempDir()
	cfgDir := filepath.Join(dir, "cfg")
	if err := os.Mkdir(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeDir(t, cfgDir, "agw.yaml", agwFile)
	mapPath := filepath.Join(dir, "map.yaml")
	writeDir(t, dir, "map.yaml", mapFile)
	s := &sink{}
	a := &Applier{Sink: s, Logger: quiet()}
	bm := &BudgetMapFile{Path: mapPath}
	if err := bm.Load(a); err != nil {
		t.Fatal(err)
	}
	if err := (&Files{Dir: config.DirOptions{Root: cfgDir}}).Load(a); err != nil {
		t.Fatal(err)
	}
	if err := a.ApplyProto(t.Context(), egProto("gw/s-gw1")); err != nil {
		t.Fatal(err)
	}
	c, _ := s.get()
	got := scopes(c)
	want := map[string]string{
		"agents/s-agw.budget_per-key.principal":                   "s/per-key",
		"agents/s-agw.budget_per-key.principal_vip":               "s/per-key fixed vip",
		"gw/s-gw1.gw/s-gw1/rule/0_gw/s-gw1/rule/0.rule-0-match-0": "s/per-key",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("scope of %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	// A broken map is rejected; the scopes stay.
	writeDir(t, dir, "map.yaml", strings.Replace(mapFile, "window: day", `window: ""`, 1))
	if err := bm.Load(a); err == nil || !strings.Contains(err.Error(), "map.yaml:13: entries[0].window") {
		t.Fatalf("bad map: err = %v", err)
	}
	if c, _ := s.get(); scopes(c)["gw/s-gw1.gw/s-gw1/rule/0_gw/s-gw1/rule/0.rule-0-match-0"] != "s/per-key" {
		t.Error("bad map dropped the scopes")
	}
	// A map without the EG entry: reloaded, that rule keeps its own counter.
	writeDir(t, dir, "map.yaml", mapFile[:strings.Index(mapFile, "  - domain: gw/s-gw1")])
	if err := bm.Load(a); err != nil {
		t.Fatal(err)
	}
	c, _ = s.get()
	if got := scopes(c); got["gw/s-gw1.gw/s-gw1/rule/0_gw/s-gw1/rule/0.rule-0-match-0"] != "-" || got["agents/s-agw.budget_per-key.principal"] != "s/per-key" {
		t.Errorf("after reload: %v", got)
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A file update refused only because its domain is also in the xDS config is
// installed once the xDS config drops that domain: the files on disk do not
// change again, so their poll never loads them again, and without this the
// file's domain stayed unserved (or its old limits in force) until someone
// touched the directory.
func TestFileHeldByAConflictIsInstalledWhenTheConflictEnds(t *testing.T) {
	dir := t.TempDir()
	writeDir(t, dir, "agw.yaml", agwFile)
	s := &sink{}
	a := &Applier{Sink: s, Logger: quiet()}
	files := &Files{Dir: config.DirOptions{Root: dir}}
	if err := files.Load(a); err != nil {
		t.Fatal(err)
	}
	both := append(egProto("gw/s-gw1"), egProto("team/moved")...)
	if err := a.ApplyProto(t.Context(), both); err != nil {
		t.Fatal(err)
	}
	domains := func() string { c, _ := s.get(); return strings.Join(c.Domains(), ",") }
	// team/moved moves from Envoy Gateway to the files: the file comes first.
	writeDir(t, dir, "moved.yaml", "domain: team/moved\ndescriptors: [{key: k, rate_limit: {unit: day, requests_per_unit: 7}}]\n")
	if err := files.Load(a); err == nil || !strings.Contains(err.Error(), "duplicate domain 'team/moved'") {
		t.Fatalf("conflicting file: err = %v", err)
	}
	if got := domains(); got != "agents/s-agw,gw/s-gw1,team/moved" {
		t.Fatalf("after the conflicting file: %s", got)
	}
	// Envoy Gateway drops the domain; the directory is unchanged.
	if err := a.ApplyProto(t.Context(), egProto("gw/s-gw1")); err != nil {
		t.Fatal(err)
	}
	if err := files.Load(a); err != nil {
		t.Fatal(err)
	}
	c, _ := s.get()
	if got := domains(); got != "agents/s-agw,gw/s-gw1,team/moved" {
		t.Fatalf("after xDS dropped team/moved: %s; want the file's team/moved served", got)
	}
	for _, l := range c.Limits() {
		if l.Domain == "team/moved" && (l.RequestsPerUnit != 7 || l.Rule != "team/moved.k") {
			t.Errorf("team/moved limit = %s %d; want the file's (team/moved.k, 7)", l.Rule, l.RequestsPerUnit)
		}
	}
}

// An xDS update that keeps a budget's domain but no longer holds the rule
// the budget map names (a policy's rules reordered, so rule/0 is now
// rule/1; a rule removed) leaves that rule counting alone, outside its
// budget's bucket. It is installed (Envoy Gateway's config is the truth),
// but said: a WARN naming the entry and the gauge of unmatched entries.
// Entries whose domain is absent (the other Deployment's gateway, which
// reads the same map) are not counted.
func TestBudgetRuleMissingFromItsDomainIsReported(t *testing.T) {
	dir := t.TempDir()
	writeDir(t, dir, "map.yaml", mapFile)
	var logs strings.Builder
	m := metrics.New(nil)
	a := &Applier{Sink: &sink{}, Metrics: m, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	if err := (&BudgetMapFile{Path: filepath.Join(dir, "map.yaml")}).Load(a); err != nil {
		t.Fatal(err)
	}
	unmatched := func() int { return int(testutil.ToFloat64(m.BudgetMapUnmatched)) }
	if err := a.ApplyProto(t.Context(), egProto("gw/s-gw1")); err != nil {
		t.Fatal(err)
	}
	if n := unmatched(); n != 0 {
		t.Errorf("every entry of a present domain matched: unmatched = %d", n)
	}
	moved := egProto("gw/s-gw1")
	moved[0].Descriptors[0].Key, moved[0].Descriptors[0].Value = "gw/s-gw1/rule/1", "gw/s-gw1/rule/1"
	if err := a.ApplyProto(t.Context(), moved); err != nil {
		t.Fatal(err)
	}
	if n := unmatched(); n != 1 {
		t.Errorf("unmatched = %d, want 1 (gw/s-gw1's rule/0)", n)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "gw/s-gw1/rule/0") || !strings.Contains(logs.String(), "budget=per-key") {
		t.Errorf("no warning naming the entry:\n%s", logs.String())
	}
	if err := a.ApplyProto(t.Context(), egProto("gw/s-gw1")); err != nil {
		t.Fatal(err)
	}
	if n := unmatched(); n != 0 {
		t.Errorf("after the rule came back: unmatched = %d", n)
	}
}
