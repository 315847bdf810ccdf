// Package examples holds the example spec (budgets.yaml: B1-B2 on
// agentgateway, B3-B5 on Envoy Gateway) and the test that its committed
// render, rate limit config and budget map are what the header's render
// command writes today, and that the service and the gate accept them.
package examples

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/internal/cli"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// TestCommittedRenderIsCurrent renders the spec into a temporary directory
// with the CLI and compares every file with the committed ones.
func TestCommittedRenderIsCurrent(t *testing.T) {
	tmp := t.TempDir()
	out := filepath.Join(tmp, "rendered")
	rls := filepath.Join(tmp, "ratelimit")
	bm := filepath.Join(tmp, "budget-map.yaml")
	var stdout, stderr bytes.Buffer
	code := cli.Run(t.Context(), []string{"render", "budgets.yaml", "-o", out, "--ratelimit-config", rls, "--budget-map", bm}, nil, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("render exit %d: %s", code, stderr.String())
	}
	compareDir(t, out, "rendered")
	compareDir(t, rls, "ratelimit")
	got, _ := os.ReadFile(bm)
	want, err := os.ReadFile("budget-map.yaml")
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("budget-map.yaml is stale (err %v); regenerate with the command in budgets.yaml", err)
	}
	// What the service loads: the merged config and the map.
	if _, err := config.LoadDir(config.DirOptions{Root: "ratelimit"}); err != nil {
		t.Errorf("the service cannot load ratelimit/: %v", err)
	}
	if _, err := budgetmap.LoadFile("budget-map.yaml"); err != nil {
		t.Errorf("the service cannot load budget-map.yaml: %v", err)
	}
	// The gate passes on the committed render (BG020 on the AgentgatewayPolicy
	// and its domain's rate limit config, drift against the spec, BG013 with
	// the rendered GatewayConfig), with the
	// platform's Gateway objects of the gitops example for the identity checks
	// of the Envoy Gateway side.
	stdout.Reset()
	stderr.Reset()
	if code := cli.Run(t.Context(), []string{"assert", "--spec", "budgets.yaml", "rendered", "ratelimit", "gitops/deploy/gateway"}, nil, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "ok: 0 errors, 0 warnings") {
		t.Errorf("assert exit %d:\n%s%s", code, stdout.String(), stderr.String())
	}
}

func compareDir(t *testing.T, got, want string) {
	t.Helper()
	ge, err := os.ReadDir(got)
	if err != nil {
		t.Fatal(err)
	}
	we, err := os.ReadDir(want)
	if err != nil {
		t.Fatal(err)
	}
	if len(ge) != len(we) {
		t.Errorf("%s has %d files, render writes %d", want, len(we), len(ge))
	}
	for _, e := range ge {
		a, _ := os.ReadFile(filepath.Join(got, e.Name()))
		b, err := os.ReadFile(filepath.Join(want, e.Name()))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s/%s is stale (err %v); regenerate with the command in budgets.yaml", want, e.Name(), err)
		}
	}
}
