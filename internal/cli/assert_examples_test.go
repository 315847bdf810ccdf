package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestAssertRenderedExamplesPass runs the gate, drift check included, over
// render's committed output for examples/ (the policies and the rate limit
// config, where agentgateway's shadow modes live) together with the platform
// objects a GitOps repo holds next to it (Gateway, routes, SecurityPolicies).
func TestAssertRenderedExamplesPass(t *testing.T) {
	code, out, errOut := runAssertCLI(t, "", "assert", "--spec", "../../examples/budgets.yaml",
		"../../examples/rendered", "../../examples/ratelimit", "../../examples/gitops/deploy/gateway")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "ok: 0 errors, 0 warnings") {
		t.Errorf("output:\n%s", out)
	}
}

// TestAssertDriftShowsDiff edits a copy of the rendered output by hand and
// expects BG008 with a unified diff, plus a leftover object reported stale.
func TestAssertDriftShowsDiff(t *testing.T) {
	dir := t.TempDir()
	src := "../../examples/rendered/backendtrafficpolicy_ai-gateway_ai-budgets-agent-router.yaml"
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	// per-human's cap (rule 0 of the Envoy Gateway policy); the newline keeps
	// acme-batch's 20000000 out of the match.
	edited := strings.Replace(string(data), "requests: 2000000\n", "requests: 9000000\n", 1)
	if edited == string(data) {
		t.Fatal("fixture edit did not apply")
	}
	if err := os.WriteFile(filepath.Join(dir, "btp.yaml"), []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	stale := "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: ClientTrafficPolicy\nmetadata:\n  name: old\n  namespace: ai-gateway\n  labels: {app.kubernetes.io/managed-by: budgetgen}\nspec:\n  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: other}]\n"
	if err := os.WriteFile(filepath.Join(dir, "stale.yaml"), []byte(stale), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runAssertCLI(t, "", "assert", "--skip", "BG006,BG007", "--spec", "../../examples/budgets.yaml", dir)
	if code != 1 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		"btp.yaml:2:1: BG008 error: BackendTrafficPolicy ai-gateway/ai-budgets-agent-router differs",
		"../../examples/budgets.yaml:1: BG008 error: render produces ClientTrafficPolicy ai-gateway/ai-budgets-agent-router-headers",
		"../../examples/budgets.yaml:1: BG008 error: render produces AgentgatewayPolicy agents/ai-budgets-agent-gateway",
		"stale.yaml:1:1: BG008 error: ClientTrafficPolicy ai-gateway/old looks rendered by budgetgen",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`(?m)^\s+-\s+requests: 9000000$`).MatchString(out) || !regexp.MustCompile(`(?m)^\s+\+\s+requests: 2000000$`).MatchString(out) {
		t.Errorf("no unified diff of the edited line:\n%s", out)
	}
}

// The drift check renders with the base policy: the committed merged policy
// passes, and a base policy changed since the last render is drift.
func TestAssertBasePolicyDrift(t *testing.T) {
	ex := "../../examples/base-policy"
	code, out, errOut := runAssertCLI(t, "", "assert", "--spec", ex+"/budgets.yaml", ex+"/rendered", ex+"/gateway")
	if code != 0 || !strings.Contains(out, "ok: 0 errors") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	dir := t.TempDir()
	for _, f := range []string{"budgets.yaml", "gateway-team/agent-router-traffic.yaml"} {
		data, err := os.ReadFile(filepath.Join(ex, f))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, "traffic.yaml") {
			data = []byte(strings.Replace(string(data), "requestTimeout: 120s", "requestTimeout: 90s", 1))
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	code, out, _ = runAssertCLI(t, "", "assert", "--skip", "BG007", "--spec", filepath.Join(dir, "budgets.yaml"), ex+"/rendered", ex+"/gateway")
	if code != 1 || !strings.Contains(out, "BG008") || !strings.Contains(out, "requestTimeout: 90s") {
		t.Errorf("changed base not reported as drift: exit %d\n%s", code, out)
	}
}
