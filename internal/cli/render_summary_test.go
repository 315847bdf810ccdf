package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRenderSummary: render -o says what it wrote, per Gateway of the spec
// (objects, rules, budgets), and warns that agentgateway budgets need
// --ratelimit-config to bind; with it (and the budget map) no warning.
func TestRenderSummary(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := runStdin(t, "", "render", examplePath, "-o", filepath.Join(dir, "out"))
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"wrote " + filepath.Join(dir, "out") + ": 7 files (6 objects and kustomization.yaml)",
		"  Gateway ai-gateway/agent-router (Envoy Gateway):\n    BackendTrafficPolicy ai-gateway/ai-budgets-agent-router: 7 rate limit rules (budgets per-human, per-api-key, frontier)\n    ClientTrafficPolicy ai-gateway/ai-budgets-agent-router-headers\n",
		"  Gateway agents/agent-gateway (agentgateway):\n    AgentgatewayPolicy agents/ai-budgets-agent-gateway: 2 descriptors (budgets per-run, agent-fleet)\n",
		"  ReferenceGrant envoy-gateway-system/ai-budgets-agentgateway-ratelimit\n",
		"  AgentgatewayPolicy envoy-gateway-system/ai-budgets-ratelimit-tls\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "warning: agentgateway budgets agent-fleet, per-run bind only when") || !strings.Contains(stderr, "--ratelimit-config DIR") {
		t.Errorf("no --ratelimit-config warning:\n%s", stderr)
	}
	code, stdout, stderr = runStdin(t, "", "render", examplePath, "-o", filepath.Join(dir, "out"), "--ratelimit-config", filepath.Join(dir, "rls"), "--budget-map", filepath.Join(dir, "map.yaml"))
	if code != ExitOK || strings.Contains(stderr, "warning") || !strings.Contains(stdout, "rls: 2 rate limit service config files") || !strings.Contains(stdout, "map.yaml: the budget map") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// To stdout: the YAML stream only.
	if _, stdout, _ = runStdin(t, "", "render", examplePath); strings.Contains(stdout, "wrote ") {
		t.Errorf("summary in the YAML stream:\n%s", stdout)
	}
}

// TestRenderWarnsBudgetMap: a budget on an agentgateway Gateway and another
// Gateway is one bucket only with the budget map.
func TestRenderWarnsBudgetMap(t *testing.T) {
	b, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(string(b), "gateways: [agents/agent-gateway], reserve", "gateways: [agents/agent-gateway, ai-gateway/agent-router], reserve", 1)
	if src == string(b) {
		t.Fatal("spec edit did not apply")
	}
	dir := t.TempDir()
	spec := filepath.Join(dir, "budgets.yaml")
	if err := os.WriteFile(spec, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runStdin(t, "", "render", spec, "-o", filepath.Join(dir, "out"), "--ratelimit-config", filepath.Join(dir, "rls"))
	if code != ExitOK || !strings.Contains(stderr, "warning: budgets per-run run on an agentgateway Gateway and another Gateway") || !strings.Contains(stderr, "--budget-map FILE") {
		t.Errorf("exit %d: %s", code, stderr)
	}
	if _, _, stderr = runStdin(t, "", "render", spec, "-o", filepath.Join(dir, "out"), "--ratelimit-config", filepath.Join(dir, "rls"), "--budget-map", filepath.Join(dir, "m.yaml")); strings.Contains(stderr, "warning") {
		t.Errorf("warned with the budget map: %s", stderr)
	}
}

// TestRenderSummaryOfStarter: the summary of budgetgen init's starter, a
// new user's first render: its one budget is two rules (its principals' and
// its unidentified requests'); a lone group budget's one rule is counted in
// the singular.
func TestRenderSummaryOfStarter(t *testing.T) {
	dir := t.TempDir()
	spec := filepath.Join(dir, "budgets.yaml")
	if code, _, stderr := runStdin(t, "", "init", "-o", spec, "--no-gateway"); code != ExitOK {
		t.Fatalf("init: exit %d: %s", code, stderr)
	}
	code, stdout, stderr := runStdin(t, "", "render", spec, "-o", filepath.Join(dir, "out"))
	if code != ExitOK || !strings.Contains(stdout, "BackendTrafficPolicy ai-gateway/ai-budgets-ai-gateway: 2 rate limit rules (budgets per-api-key)\n") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	group := filepath.Join(dir, "group.yaml")
	doc := "apiVersion: budgetgen.dev/v1alpha1\nkind: BudgetSet\nmetadata: {name: g}\nspec:\n  gateways: [{namespace: ai-gateway, name: ai-gateway}]\n" +
		"  identities: {x-ar-kind: {jwtClaim: kind}}\n  budgets: [{name: fleet, group: {header: x-ar-kind, equals: agent}, tokensPerDay: 1000}]\n"
	if err := os.WriteFile(group, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runStdin(t, "", "render", group, "-o", filepath.Join(dir, "group-out"))
	if code != ExitOK || !strings.Contains(stdout, "BackendTrafficPolicy ai-gateway/g-ai-gateway: 1 rate limit rule (budgets fleet)\n") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}
