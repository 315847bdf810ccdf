package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/assert"
)

func runAssertCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Run(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

const rulesDir = "../../pkg/assert/testdata/rules/"

func TestAssertFlagParsing(t *testing.T) {
	cases := []struct {
		name    string
		opts    assertOptions
		wantErr string
		skip    []string
	}{
		{"defaults", assertOptions{Paths: []string{"x"}, Output: "text", FailOn: "error", MaxFileSize: 1}, "", nil},
		{"no paths", assertOptions{Output: "text", FailOn: "error", MaxFileSize: 1}, "no input", nil},
		{"unknown format", assertOptions{Paths: []string{"x"}, Output: "xml", FailOn: "error", MaxFileSize: 1}, `unknown output format "xml"`, nil},
		{"format case", assertOptions{Paths: []string{"x"}, Output: "SARIF", FailOn: "error", MaxFileSize: 1}, "", nil},
		{"fail-on", assertOptions{Paths: []string{"x"}, Output: "text", FailOn: "info", MaxFileSize: 1}, "--fail-on", nil},
		{"skip list", assertOptions{Paths: []string{"x"}, Output: "text", FailOn: "warning", Skip: []string{"bg001,BG007", " bg010 "}, MaxFileSize: 1}, "", []string{"BG001", "BG007", "BG010"}},
		{"skip unknown", assertOptions{Paths: []string{"x"}, Output: "text", FailOn: "error", Skip: []string{"BG042"}, MaxFileSize: 1}, "--skip BG042", nil},
		{"bad version", assertOptions{Paths: []string{"x"}, Output: "text", FailOn: "error", EnvoyGatewayVersion: "latest", MaxFileSize: 1}, "--envoy-gateway-version", nil},
		{"stdin twice", assertOptions{Paths: []string{"-"}, Spec: "-", Output: "text", FailOn: "error", MaxFileSize: 1}, "stdin cannot be both", nil},
		{"max size", assertOptions{Paths: []string{"x"}, Output: "text", FailOn: "error"}, "--max-file-size", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts
			err := o.validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				if strings.Join(o.Skip, ",") != strings.Join(tc.skip, ",") {
					t.Errorf("skip %v, want %v", o.Skip, tc.skip)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || exitCode(err) != ExitUsage {
				t.Errorf("validate: %v (exit %d), want usage error containing %q", err, exitCode(err), tc.wantErr)
			}
		})
	}
}

func TestAssertExitCodes(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	notYAML := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(notYAML, []byte("apiVersion: v1\nkind: [oops\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name        string
		stdin       string
		args        []string
		code        int
		out, errOut string
	}{
		{"clean", "", []string{"assert", "--allow-enforce", "frontier", rulesDir + "clean_budgetgen_style.yaml"}, 0, ": 0 errors", ""},
		{"hand-written clean", "", []string{"assert", rulesDir + "clean_aigw_docs_style.yaml"}, 0, ": 0 errors", ""},
		{"findings", "", []string{"assert", rulesDir + "bg009_override.yaml"}, 1, "BG009 error: override x-api-key-client=big-co", ""},
		{"warning passes by default", "", []string{"assert", rulesDir + "bg010_shared_cost.yaml", "--envoy-gateway-version", "1.8.1"}, 0, "BG010 warning", ""},
		{"warning fails with --fail-on warning", "", []string{"assert", "--fail-on", "warning", rulesDir + "bg010_shared_cost.yaml", "--envoy-gateway-version", "1.8.1"}, 1, "BG010 warning", ""},
		{"skip", "", []string{"assert", "--skip", "BG009", rulesDir + "bg009_override.yaml"}, 0, fmt.Sprintf(" %d rules, skipped BG009", len(assert.Rules())-1), ""},
		{"stdin", "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {name: x, namespace: y}\nspec:\n  rateLimit:\n    global:\n      rules:\n        - limit: {requests: 1, unit: Day}\n          cost: {request: {from: Number, number: 0}, response: {from: Metadata, metadata: {namespace: io.envoy.ai_gateway, key: llm_total_token}}}\n          shadowMode: true\n", []string{"assert", "--skip", "BG007", "-"}, 1, "<stdin>:8:11: BG001", ""},
		{"missing path", "", []string{"assert", filepath.Join(dir, "nope")}, 2, "", "nope: no such file or directory"},
		{"not yaml", "", []string{"assert", notYAML}, 2, "", "bad.yaml:1: invalid YAML"},
		{"not an object on stdin", "just a string\n", []string{"assert", "-"}, 2, "", "<stdin>:1:1: not a Kubernetes object"},
		{"too large", "", []string{"assert", "--max-file-size", "10", rulesDir + "bg004_unit.yaml"}, 2, "", "input too large"},
		{"missing spec", "", []string{"assert", "--spec", filepath.Join(dir, "spec.yaml"), rulesDir + "bg004_unit.yaml"}, 2, "", "load spec"},
		{"alias bomb", billionLaughs(), []string{"assert", "-"}, 2, "", "<stdin>:1:1: document expands to too many nodes through aliases"},
		{"unknown EG kind", "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BudgetPolicy\nmetadata: {name: x, namespace: y}\n", []string{"assert", "-"}, 1, "<stdin>:1:1: BG007 error: rejected by Envoy Gateway's CRDs: failed to retrieve validator: kind BudgetPolicy not found", ""},
		{"other kinds ignored", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n", []string{"assert", "--allow-empty", "-"}, 0, "ok: 0 errors, 0 warnings in 1 object", ""},
		// Budgets that all run on agentgateway: no BackendTrafficPolicy, still a budget input.
		{"agentgateway only", agwPolicy + agwGrant, []string{"assert", "-"}, 0, "ok: 0 errors, 0 warnings in 2 objects", ""},
		{"agentgateway without its ReferenceGrant warns", agwPolicy, []string{"assert", "-"}, 0, "BG020 warning: the rate limit Service envoy-gateway-system/envoy-ratelimit is in another namespace", ""},
		{"agentgateway without a global rate limit is no budget", "apiVersion: agentgateway.dev/v1alpha1\nkind: AgentgatewayPolicy\nmetadata: {name: p, namespace: agents}\nspec:\n  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: g}]\n", []string{"assert", "-"}, 1, "", "no budget policy"},
		{"no budget policy fails closed", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n", []string{"assert", "-"}, 1, "budgetgen assert: FAIL: no budget policy: 0 errors, 0 warnings in 1 object", "no budget policy in the input (1 objects from 1 files)"},
		{"empty directory fails closed", "", []string{"assert", dir + "/empty"}, 1, "budgetgen assert: FAIL: no budget policy: 0 errors", "no budget policy in the input (0 objects from 0 files)"},
		{"plain rate limit is no budget", "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {name: x, namespace: y}\nspec:\n  rateLimit:\n    global:\n      rules:\n        - limit: {requests: 100, unit: Second}\n", []string{"assert", "--skip", "BG007", "-"}, 1, "", "no budget policy"},
		{"usage", "", []string{"assert", "-o", "yaml", "x"}, 2, "", "unknown output format"},
		{"unknown flag", "", []string{"assert", "--nope", "x"}, 2, "", "unknown flag"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runAssertCLI(t, tc.stdin, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.out) || !strings.Contains(errOut, tc.errOut) {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, out, errOut)
			}
			if strings.Contains(errOut, "panic") {
				t.Errorf("panic: %s", errOut)
			}
		})
	}
}

// TestAssertWholeRepoSkipsForeignYAML: asserting a whole GitOps checkout
// (CI configs and pre-commit hooks next to manifests) reads the manifests,
// names the skipped files on stderr, and passes; naming such a file
// directly is still an input error.
func TestAssertWholeRepoSkipsForeignYAML(t *testing.T) {
	repo := "../../examples/gitops"
	code, out, errOut := runAssertCLI(t, "", "assert", "--spec", repo+"/budgets/budgets.yaml", repo)
	if code != 0 || !strings.Contains(out, "ok: 0 errors") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "skipped "+repo+"/.pre-commit-config.yaml: no Kubernetes object") {
		t.Fatalf("skipped file not reported:\n%s", errOut)
	}
	code, _, errOut = runAssertCLI(t, "", "assert", repo+"/.pre-commit-config.yaml")
	if code != 2 || !strings.Contains(errOut, "not a Kubernetes object") {
		t.Fatalf("named foreign file: exit %d, stderr:\n%s", code, errOut)
	}
}

func TestAssertOutputFormats(t *testing.T) {
	for format, want := range map[string]string{
		"json":   `"rule": "BG009"`,
		"github": "::error file=",
		"junit":  "<testsuites",
		"sarif":  `"version": "2.1.0"`,
	} {
		code, out, _ := runAssertCLI(t, "", "assert", "--skip", "BG007", "-o", format, rulesDir+"bg009_override.yaml")
		if code != 1 || !strings.Contains(out, want) {
			t.Errorf("%s: exit %d, output:\n%s", format, code, out)
		}
	}
}

// billionLaughs is the classic alias bomb: 9^9 strings from under 1 KB.
func billionLaughs() string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lol}\ndata:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
		b.WriteString("  " + n + ": &" + n + " [" + strings.TrimSuffix(strings.Repeat("*"+prev+", ", 9), ", ") + "]\n")
		prev = n
	}
	return b.String()
}

// agwPolicy is an AgentgatewayPolicy as budgetgen renders it: one budget,
// its principal from the verified JWT.
const agwPolicy = `apiVersion: agentgateway.dev/v1alpha1
kind: AgentgatewayPolicy
metadata: {name: ai-budgets-agent-gw, namespace: agents}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: agent-gw}]
  traffic:
    rateLimit:
      global:
        backendRef: {group: "", kind: Service, name: envoy-ratelimit, namespace: envoy-gateway-system, port: 8081}
        descriptors:
          - entries:
              - {name: budget, expression: '"per-run"'}
              - {name: principal, expression: 'coalesce(string(jwt["run_id"]), "budgetgen/no-claim")'}
            unit: Tokens
        domain: agents/ai-budgets-agent-gw
        failureMode: FailOpen
`

// agwGrant lets agwPolicy reach the rate limit Service, as render writes it.
const agwGrant = `---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: ai-budgets-agentgateway-ratelimit, namespace: envoy-gateway-system}
spec:
  from: [{group: agentgateway.dev, kind: AgentgatewayPolicy, namespace: agents}]
  to: [{group: "", kind: Service, name: envoy-ratelimit}]
`
