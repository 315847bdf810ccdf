package service

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/syncbuf"
)

const (
	egDomainFile = `domain: edge/s-gw1
descriptors:
  - key: edge/s-gw1/rule/0
    value: edge/s-gw1/rule/0
    descriptors:
      - key: rule-0-match-0
        rate_limit: {unit: day, requests_per_unit: 2}
`
	agwDomainFile = `domain: agents/s-agw
descriptors:
  - key: budget
    value: per-user
    descriptors:
      - key: principal
        rate_limit: {unit: day, requests_per_unit: 2}
`
	budgetMapFile = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetMap
budgetSet: s
entries:
  - domain: edge/s-gw1
    descriptor: [{key: edge/s-gw1/rule/0, value: edge/s-gw1/rule/0}]
    gateway: {kind: envoy, namespace: edge, name: gw1}
    budget: per-user
    bucket: s/per-user
    kind: tokens
    principal: {header: x-user}
    tokensPerDay: 2
    window: day
    mode: enforce
  - domain: agents/s-agw
    descriptor: [{key: budget, value: per-user}, {key: principal}]
    gateway: {kind: agentgateway, namespace: agents, name: agw}
    budget: per-user
    bucket: s/per-user
    kind: tokens
    principal: {expression: 'string(jwt["sub"])'}
    tokensPerDay: 2
    window: day
    mode: enforce
`
)

// The service with --budget-map counts one principal's calls through an
// Envoy Gateway domain and an agentgateway domain in one counter; without
// the map each domain counts alone. A bad map at start is an error.
func TestRunWithBudgetMap(t *testing.T) {
	run := func(withMap bool) rlpb.RateLimitResponse_Code {
		dir := t.TempDir()
		cfg := filepath.Join(dir, "config")
		if err := os.Mkdir(cfg, 0o755); err != nil {
			t.Fatal(err)
		}
		writeConfig(t, cfg, "eg.yaml", egDomainFile)
		writeConfig(t, cfg, "agw.yaml", agwDomainFile)
		var args []string
		if withMap {
			writeConfig(t, dir, "map.yaml", budgetMapFile)
			args = []string{"--budget-map", filepath.Join(dir, "map.yaml")}
		}
		s := startService(t, cfg, nil, args...)
		rule := "edge/s-gw1/rule/0"
		for range 2 {
			if r := call(t, s.client, "edge/s-gw1", rule, rule, "rule-0-match-0", "u1"); r.OverallCode != rlpb.RateLimitResponse_OK {
				t.Fatalf("call through gw1: %s", r.OverallCode)
			}
		}
		return call(t, s.client, "agents/s-agw", "budget", "per-user", "principal", "u1").OverallCode
	}
	if got := run(true); got != rlpb.RateLimitResponse_OVER_LIMIT {
		t.Errorf("third call of u1 via agentgateway with the map: %s, want OVER_LIMIT (one budget)", got)
	}
	if got := run(false); got != rlpb.RateLimitResponse_OK {
		t.Errorf("without the map: %s, want OK (a counter per domain)", got)
	}
}

func TestRunRejectsBadBudgetMap(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, "eg.yaml", egDomainFile)
	bad := filepath.Join(t.TempDir(), "map.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: budgetgen.dev/v1alpha1\nkind: BudgetMap\nbudgetSet: s\nentries: [{domain: x}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir() // the embedded store's snapshot, not the machine's shared default
	err := Run(t.Context(), []string{"--config-dir", dir, "--budget-map", bad}, func(k string) string {
		return map[string]string{"PORT": "0", "GRPC_PORT": "0", "DEBUG_PORT": "0", "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1", "XDG_STATE_HOME": state}[k]
	}, &syncbuf.Buffer{}, nil)
	if err == nil {
		t.Fatal("service started with an invalid budget map")
	}
	if want := bad + ":4: entries[0].descriptor: needs at least one level"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %q", err, want)
	}
}
