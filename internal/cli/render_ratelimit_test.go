package cli

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	rlconfig "github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/rlsconfig"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// render --ratelimit-config writes, next to the policies, the service config
// Envoy Gateway would derive from them: the service's own loader reads the
// directory, and every descriptor Envoy would send for a request finds a limit.
func TestRenderRateLimitConfig(t *testing.T) {
	dir := t.TempDir()
	rls := filepath.Join(dir, "ratelimit", "config")
	code, _, stderr := runStdin(t, "", "render", examplePath, "-o", filepath.Join(dir, "policies"), "--ratelimit-config", rls)
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	cfg, err := rlconfig.LoadDir(rlconfig.DirOptions{Root: dir, Subdirectory: "ratelimit", AppDirectory: "config", IgnoreDotFiles: true})
	if err != nil {
		t.Fatalf("the service cannot load the written config: %v", err)
	}

	bs, err := spec.LoadFile(examplePath, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := render.Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	// One domain per Envoy Gateway policy (<ns>/<policy>) and per
	// AgentgatewayPolicy (its global rate limit's domain).
	var btps []*egv1a1.BackendTrafficPolicy
	var agws []*agentgateway.Policy
	var want []string
	for _, o := range res.Objects {
		switch p := agentgateway.Model(o.Object).(type) {
		case *egv1a1.BackendTrafficPolicy:
			btps = append(btps, p)
			want = append(want, p.Namespace+"/"+p.Name)
		case *agentgateway.Policy:
			if p.Spec.Traffic == nil {
				continue // the backend TLS policy on the rate limit Service
			}
			agws = append(agws, p)
			want = append(want, p.Spec.Traffic.RateLimit.Global.Domain)
		}
	}
	sort.Strings(want)
	if got := cfg.Domains(); strings.Join(got, ",") != strings.Join(want, ",") || len(btps) == 0 || len(agws) == 0 {
		t.Fatalf("domains = %v, want %v (from %d BackendTrafficPolicies and %d AgentgatewayPolicies)", got, want, len(btps), len(agws))
	}
	entries, _ := os.ReadDir(rls)
	if len(entries) != len(want) {
		t.Errorf("%d files for %d domains", len(entries), len(want))
	}
	// Every rule's first descriptor level is in the loaded config: the
	// domain holds one limit per rendered rule, and one per agentgateway
	// descriptor (the example has no agentgateway overrides).
	rules := 0
	for _, p := range btps {
		rules += len(p.Spec.RateLimit.Global.Rules)
	}
	for _, p := range agws {
		rules += len(p.Spec.Traffic.RateLimit.Global.Descriptors)
	}
	if n := len(cfg.Limits()); n != rules {
		t.Errorf("the service loaded %d limits for %d rendered rules and descriptors", n, rules)
	}

	// Byte-identical on a second run (and no temporary files left).
	before, _ := os.ReadFile(filepath.Join(rls, entries[0].Name()))
	if code, _, stderr := runStdin(t, "", "render", examplePath, "--ratelimit-config", rls); code != ExitOK {
		t.Fatalf("second run exit %d: %s", code, stderr)
	}
	after, _ := os.ReadFile(filepath.Join(rls, entries[0].Name()))
	if string(before) != string(after) || !rlsconfig.IsGenerated(after) {
		t.Error("second run changed the output")
	}
	if again, _ := os.ReadDir(rls); len(again) != len(entries) {
		t.Errorf("second run left %d entries, want %d", len(again), len(entries))
	}

	// A file in the way: a usage error, and nothing written.
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := runStdin(t, "", "render", examplePath, "--ratelimit-config", blocker); code != ExitUsage {
		t.Errorf("--ratelimit-config on a file: exit %d, want %d", code, ExitUsage)
	}
}

// The committed examples/ratelimit (what `go run ./cmd/ratelimit --config-dir
// examples/ratelimit` serves) is what render writes from the example spec today.
// Regenerate with the command in examples/budgets.yaml's header.
func TestExampleRateLimitConfigUpToDate(t *testing.T) {
	committed := filepath.Join("..", "..", "examples", "ratelimit")
	fresh := filepath.Join(t.TempDir(), "rls")
	if code, _, stderr := runStdin(t, "", "render", examplePath, "--ratelimit-config", fresh); code != ExitOK {
		t.Fatalf("render: exit %d: %s", code, stderr)
	}
	want, err := os.ReadDir(fresh)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadDir(committed)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("examples/ratelimit has %d files, render writes %d", len(got), len(want))
	}
	for _, e := range want {
		w, _ := os.ReadFile(filepath.Join(fresh, e.Name()))
		g, err := os.ReadFile(filepath.Join(committed, e.Name()))
		if err != nil || string(g) != string(w) {
			t.Errorf("examples/ratelimit/%s is stale (err %v); regenerate it (see the test's comment)", e.Name(), err)
		}
	}
	if _, err := rlconfig.LoadDir(rlconfig.DirOptions{Root: committed}); err != nil {
		t.Errorf("the service cannot load examples/ratelimit: %v", err)
	}
}

// With a base policy, --ratelimit-config holds the base's global rules too:
// they share the policy's domain, ahead of the budgets.
func TestRenderRateLimitConfigWithBasePolicy(t *testing.T) {
	dir := t.TempDir()
	rls := filepath.Join(dir, "rls")
	code, _, stderr := runStdin(t, "", "render", "../../examples/base-policy/budgets.yaml", "-o", filepath.Join(dir, "policies"), "--ratelimit-config", rls)
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	entries, err := os.ReadDir(rls)
	if err != nil || len(entries) != 1 {
		t.Fatalf("files %v, %v: want one domain", entries, err)
	}
	data, err := os.ReadFile(filepath.Join(rls, entries[0].Name()))
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(data)
	for _, want := range []string{"domain: ai-gateway/agent-router-traffic", "ai-gateway/agent-router-traffic/rule/0", "ai-gateway/agent-router-traffic/rule/1", "ai-gateway/agent-router-traffic/rule/2", "requests_per_unit: 600", "unit: MINUTE"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
}
