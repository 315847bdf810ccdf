package render

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/internal/crdvalidate"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/spec"
	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

var update = flag.Bool("update", false, "rewrite golden files and examples/rendered from the current render")

func load(t testing.TB, path string) *spec.BudgetSet {
	t.Helper()
	bs, err := spec.LoadFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return bs
}

func validateAll(t *testing.T, res *Result) {
	t.Helper()
	v, err := crdvalidate.Shared()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range res.Objects {
		if o.Kind == KindAgentgatewayPolicy {
			validateAgentgateway(t, o)
			continue
		}
		if o.Kind == "GatewayConfig" {
			continue // Envoy AI Gateway's kind: not in EG's CRDs (TestGatewayConfig checks its shape)
		}
		if err := v.Validate(o.Manifest); err != nil {
			t.Errorf("%s %s/%s does not validate against Envoy Gateway's CRDs: %v", o.Kind, o.Namespace, o.Name, err)
		}
	}
}

// TestGolden renders every testdata spec, compares with its golden stream, and
// validates every object against EG's CRD schemas and CEL rules.
func TestGolden(t *testing.T) {
	specs, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	specs = slices.DeleteFunc(specs, func(p string) bool { return strings.HasSuffix(p, ".golden.yaml") })
	if len(specs) < 5 {
		t.Fatalf("found only %d specs in testdata", len(specs))
	}
	for _, path := range specs {
		name := strings.TrimSuffix(filepath.Base(path), ".yaml")
		t.Run(name, func(t *testing.T) {
			res, err := Render(load(t, path))
			if err != nil {
				t.Fatal(err)
			}
			got := res.YAML()
			golden := filepath.Join("testdata", name+".golden.yaml")
			if *update {
				if err := atomicfile.WriteFile(golden, got, atomicfile.Options{}); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./pkg/render -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("render differs from %s (run go test ./pkg/render -update and review the diff):\n%s", golden, got)
			}
			validateAll(t, res)
		})
	}
}

// TestExamplesRendered checks that the committed examples/rendered directory
// is exactly what render produces from examples/budgets.yaml today.
func TestExamplesRendered(t *testing.T) {
	for spec, dir := range map[string]string{
		"../../examples/budgets.yaml":             "../../examples/rendered",
		"../../examples/base-policy/budgets.yaml": "../../examples/base-policy/rendered",
	} {
		t.Run(dir, func(t *testing.T) { checkExampleRendered(t, spec, dir) })
	}
}

func checkExampleRendered(t *testing.T, specPath, dir string) {
	res, err := Render(load(t, specPath))
	if err != nil {
		t.Fatal(err)
	}
	validateAll(t, res)
	files := res.Files()
	if *update {
		if err := atomicfile.WriteDir(dir, files, atomicfile.Options{RemoveStale: func(_ string, b []byte) bool { return IsGenerated(b) }}); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("%v (run go test ./pkg/render -update)", err)
	}
	var onDisk []string
	for _, e := range entries {
		onDisk = append(onDisk, e.Name())
		want, ok := files[e.Name()]
		if !ok {
			t.Errorf("%s/%s is not rendered any more", dir, e.Name())
			continue
		}
		got, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s/%s differs from the current render (regenerate: go test ./pkg/render -update)", dir, e.Name())
		}
	}
	if len(onDisk) != len(files) {
		t.Errorf("%s holds %v, render produces %d files", dir, onDisk, len(files))
	}
}

func TestRenderRules(t *testing.T) {
	res, err := Render(load(t, "../../examples/budgets.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Objects) != 6 || res.Objects[2].Kind != "GatewayConfig" || res.Objects[3].Kind != KindAgentgatewayPolicy || res.Objects[4].Kind != KindReferenceGrant || res.Objects[5].Name != "ai-budgets-ratelimit-tls" {
		t.Fatalf("got %d objects, want a BTP, a CTP and a GatewayConfig for Envoy Gateway, an AgentgatewayPolicy, the ReferenceGrant it needs and the backend TLS policy", len(res.Objects))
	}
	btp := res.Objects[0].Object.(*egv1a1.BackendTrafficPolicy)
	//lint:ignore SA1019 the test checks the deprecated field stays unset
	if btp.Spec.RateLimit.Type != nil { //nolint:staticcheck // checks the deprecated field stays unset
		t.Error("deprecated rateLimit.type is set")
	}
	rules := btp.Spec.RateLimit.Global.Rules
	for i, r := range rules {
		if r.Shared == nil || !*r.Shared {
			t.Errorf("rule %d is not shared", i)
		}
		if r.ShadowMode == nil || !*r.ShadowMode {
			t.Errorf("rule %d of a shadow budget is not shadowMode: true", i)
		}
		if r.Limit.Unit != egv1a1.RateLimitUnitDay {
			t.Errorf("rule %d unit = %s", i, r.Limit.Unit)
		}
		if r.Cost == nil || *r.Cost.Request.Number != 0 || r.Cost.Response.Metadata.Key != "llm_total_token" {
			t.Errorf("rule %d cost = %+v", i, r.Cost)
		}
	}
	rbs, err := RuleBudgets(btp.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	if len(rbs) != len(rules) {
		t.Fatalf("annotation has %d entries for %d rules", len(rbs), len(rules))
	}
	// B3-B5 on Envoy Gateway: per-human, per-api-key and its two overrides,
	// each per-principal budget's rule for unidentified requests after its
	// own, frontier.
	var onEG []string
	for _, rb := range rbs {
		onEG = append(onEG, rb.Budget+"/"+rb.Principal)
	}
	if want := []string{"per-human/", "per-human/" + agentgateway.NoClaim, "per-api-key/", "per-api-key/acme-batch", "per-api-key/trial-42", "per-api-key/" + agentgateway.NoClaim, "frontier/"}; !slices.Equal(onEG, want) {
		t.Errorf("Envoy Gateway rules %v, want %v", onEG, want)
	}
	// The override's own rule binds its principal with its own cap, and the
	// default rule excludes it.
	for i, rb := range rbs {
		if rb.Principal != "acme-batch" {
			continue
		}
		h := rules[i].ClientSelectors[0].Headers[0]
		if *h.Value != "acme-batch" || *h.Type != egv1a1.HeaderMatchExact || rules[i].Limit.Requests != 20000000 {
			t.Errorf("override rule %d = %+v limit %d", i, h, rules[i].Limit.Requests)
		}
		def := rules[i-1].ClientSelectors[0].Headers
		if rbs[i-1].Principal != "" || *def[0].Type != egv1a1.HeaderMatchDistinct || def[0].Invert != nil || *def[1].Value != "acme-batch" || !*def[1].Invert {
			t.Errorf("default rule does not exclude acme-batch: %+v", def)
		}
	}
	// The Envoy Gateway's CTP strips every declared identity header, also
	// those only agentgateway's budgets use.
	ctp := res.Objects[1].Object.(*egv1a1.ClientTrafficPolicy)
	if got := ctp.Spec.Headers.EarlyRequestHeaders.Remove; !slices.Equal(got, []string{"x-api-key-client", "x-ar-human", "x-ar-kind", "x-ar-run"}) {
		t.Errorf("CTP removes %v", got)
	}
	// B1-B2 on agentgateway: one Tokens descriptor each, the principal from
	// the verified JWT's claim, failing open.
	agw := agentgateway.Model(res.Objects[3].Object).(*agentgateway.Policy)
	g := agw.Spec.Traffic.RateLimit.Global
	if agw.Metadata.Namespace != "agents" || len(agw.Spec.TargetRefs) != 1 || agw.Spec.TargetRefs[0].Name != "agent-gateway" ||
		g.FailureMode != agentgateway.FailOpen || g.Domain != "agents/ai-budgets-agent-gateway" || len(g.Descriptors) != 2 {
		t.Fatalf("AgentgatewayPolicy %+v", agw)
	}
	for i, want := range [][2]string{{`"per-run"`, `coalesce(string(jwt["run_id"]), "budgetgen/no-claim")`}, {`"agent-fleet"`, `coalesce(string(jwt["kind"]), "budgetgen/no-claim")`}} {
		d := g.Descriptors[i]
		if d.Unit != agentgateway.UnitTokens || len(d.Entries) != 2 || d.Entries[0].Expression != want[0] || d.Entries[1].Expression != want[1] {
			t.Errorf("descriptor %d = %+v, want budget %s, principal %s", i, d, want[0], want[1])
		}
	}
}

func TestKillSwitchAndEnforce(t *testing.T) {
	res, err := Render(load(t, "testdata/frontier_killswitch.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	btp := res.Objects[0].Object.(*egv1a1.BackendTrafficPolicy)
	rules := btp.Spec.RateLimit.Global.Rules
	if len(rules) != 2 {
		t.Fatalf("got %d rules", len(rules))
	}
	if *rules[0].ShadowMode {
		t.Error("enforced frontier cap rendered in shadow mode")
	}
	ks := rules[1]
	if ks.Cost != nil || ks.Limit.Requests != 0 || *ks.ShadowMode || !*ks.Shared {
		t.Errorf("kill switch rule = %+v", ks)
	}
	if got := *ks.ClientSelectors[0].Headers[0].Value; got != "(?:gpt-5.*)|(?:claude-opus-.*)|(?:o3|o4)" {
		t.Errorf("kill switch regex = %s", got)
	}
	rbs, _ := RuleBudgets(btp.Annotations)
	if rbs[1].Kind != budgetmap.KindKillSwitch || rbs[1].Budget != "frontier" {
		t.Errorf("annotation = %+v", rbs)
	}
	if len(res.Objects) != 1 {
		t.Errorf("no identity headers, yet %d objects rendered", len(res.Objects))
	}
}

func TestDeterministic(t *testing.T) {
	bs := load(t, "../../examples/budgets.yaml")
	first, err := Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		again, err := Render(load(t, "../../examples/budgets.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first.YAML(), again.YAML()) {
			t.Fatal("two renders of the same spec differ")
		}
	}
}

// manyOverrides builds a spec with one per-principal budget and n overrides.
func manyOverrides(n int) string {
	var b strings.Builder
	b.WriteString(`apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: big}
spec:
  gateways: [{namespace: ai-gateway, name: agent-router}]
  identities: {x-api-key-client: {apiKeyClientID: true}}
  budgets:
    - name: per-api-key
      perPrincipal: x-api-key-client
      tokensPerDay: 1000000
      overrides:
`)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "        - {principal: client-%05d, tokensPerDay: %d}\n", i, 2000000+i)
	}
	return b.String()
}

func TestManyOverridesSpillIntoSelectors(t *testing.T) {
	bs, err := spec.Load([]byte(manyOverrides(248)), "big.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	btp := res.Objects[0].Object.(*egv1a1.BackendTrafficPolicy)
	rules := btp.Spec.RateLimit.Global.Rules
	if len(rules) != 250 {
		t.Fatalf("got %d rules, want 250 (the default, 248 overrides, the unidentified requests')", len(rules))
	}
	sel := rules[0].ClientSelectors
	if len(sel) != 2 || len(sel[0].Headers) != 128 || len(sel[1].Headers) != 121 {
		t.Fatalf("default rule selectors: %d (sizes %d, %d)", len(sel), len(sel[0].Headers), len(sel[1].Headers))
	}
	validateAll(t, res)
}

func TestLimits(t *testing.T) {
	long := strings.Repeat("p", 1025)
	tests := []struct {
		name, doc, want string
	}{
		{"rules per policy", manyOverrides(255),
			"big.yaml:5: BackendTrafficPolicy ai-gateway/big-agent-router: needs 257, Envoy Gateway allows rate limit rules per BackendTrafficPolicy, and a Gateway takes one Gateway-level policy (max 256): every override is one rule, and every per-principal budget one more per window for requests without an identity header: drop overrides that are close to the default cap, move a class of principals to a group budget, or split budgets across BudgetSets targeting different Gateways or listeners (sectionName)"},
		{"exclusions per rule", manyOverrides(1100),
			"big.yaml:12: spec.budgets[0] (per-api-key) overrides: needs 1101, Envoy Gateway allows 128 header matches per selector x 8 selectors per rule to exclude overridden principals from the default rule (max 1024): keep overrides for the few principals that need them; give a class of principals its own identity header value and a group budget, or raise the default cap"},
		{"principal length", strings.Replace(manyOverrides(1), "client-00000", long, 1),
			"big.yaml:12: spec.budgets[0] (per-api-key) override " + strings.Repeat("p", 40) + "...: needs 1025, Envoy Gateway allows header match values of at most 1024 characters (max 1024): principal values are header values; use a shorter identifier (a client id, not a token)"},
		{"model regex length", strings.Replace(manyOverrides(0), "      overrides:\n", "", 1) + "  frontier: {models: [\"" + strings.Repeat("m", 1021) + "\"], tokensPerDay: 5}\n",
			"big.yaml:11: spec.frontier.models (joined regex): needs 1025, Envoy Gateway allows header match values of at most 1024 characters (max 1024): shorten the model patterns, e.g. one prefix pattern per vendor (\"gpt-5.*\")"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs, err := spec.Load([]byte(tc.doc), "big.yaml")
			if err != nil {
				t.Fatal(err)
			}
			res, err := Render(bs)
			if err == nil {
				t.Fatalf("rendered %d objects past a limit", len(res.Objects))
			}
			var le *LimitError
			if !errors.As(err, &le) {
				t.Fatalf("error %T is not a *LimitError: %v", err, err)
			}
			if err.Error() != tc.want {
				t.Errorf("error:\n got %s\nwant %s", err, tc.want)
			}
		})
	}
}

func TestRuleBudgetsParser(t *testing.T) {
	ok := map[string]string{AnnotationRuleBudgets: `[{"rule":0,"budget":"a","kind":"tokens"},{"rule":1,"budget":"a","kind":"tokens","principal":"p"},{"rule":2,"budget":"frontier","kind":"killswitch"}]`}
	rbs, err := RuleBudgets(ok)
	if err != nil {
		t.Fatal(err)
	}
	if len(rbs) != 3 || rbs[1].Principal != "p" || rbs[2].Kind != budgetmap.KindKillSwitch {
		t.Errorf("parsed %+v", rbs)
	}
	for _, bad := range []map[string]string{
		nil,
		{AnnotationRuleBudgets: `not json`},
		{AnnotationRuleBudgets: `[{"rule":2,"budget":"a","kind":"tokens"},{"rule":2,"budget":"b","kind":"tokens"}]`},
		{AnnotationRuleBudgets: `[{"rule":-1,"budget":"a","kind":"tokens"}]`},
		{AnnotationRuleBudgets: `[{"rule":0,"budget":"","kind":"tokens"}]`},
		{AnnotationRuleBudgets: `[{"rule":0,"budget":"a","kind":"requests"}]`},
	} {
		if _, err := RuleBudgets(bad); err == nil {
			t.Errorf("RuleBudgets(%v) accepted", bad)
		}
	}
}

func BenchmarkRender250Rules(b *testing.B) {
	bs, err := spec.Load([]byte(manyOverrides(248)), "big.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		res, err := Render(bs)
		if err != nil {
			b.Fatal(err)
		}
		_ = res.YAML()
	}
}

// BenchmarkRender10kOverrides measures how fast a spec far past EG's limits
// is refused: load (validation included) and render, which must fail.
func BenchmarkRender10kOverrides(b *testing.B) {
	doc := []byte(manyOverrides(10000))
	b.ReportAllocs()
	for b.Loop() {
		bs, err := spec.Load(doc, "big.yaml")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Render(bs); err == nil {
			b.Fatal("10,000 overrides rendered")
		}
	}
}

// BenchmarkRender10kOverridesRenderOnly isolates the limit check from YAML parsing.
func BenchmarkRender10kOverridesRenderOnly(b *testing.B) {
	bs, err := spec.Load([]byte(manyOverrides(10000)), "big.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Render(bs); err == nil {
			b.Fatal("10,000 overrides rendered")
		}
	}
}

// TestBasePolicyErrors: a base policy render cannot merge into is an error
// naming the base file, the line and the field; nothing is rendered.
func TestBasePolicyErrors(t *testing.T) {
	for _, tc := range []struct {
		base, want string
	}{
		{"base/local.yaml", "testdata/base/local.yaml:7: spec.rateLimit.local: a base policy with a local rate limit"},
		{"base/other-target.yaml", "testdata/base/other-target.yaml:6: spec.targetRefs[0]: targets Gateway public-edge"},
	} {
		bs := load(t, "testdata/base_policy.yaml")
		bs.Spec.Gateways[0].BasePolicy = tc.base
		if err := bs.ReadBasePolicies("testdata"); err != nil {
			t.Fatal(err)
		}
		res, err := Render(bs)
		var be *yamlpos.Error
		if err == nil || !errors.As(err, &be) || err.Error()[:len(tc.want)] != tc.want {
			t.Errorf("%s: render = %v, %v; want error starting %q", tc.base, res, err, tc.want)
		}
	}
	// A missing file fails at load, naming the spec's line.
	bs := load(t, "testdata/base_policy.yaml")
	bs.Spec.Gateways[0].BasePolicy = "base/nope.yaml"
	if err := bs.ReadBasePolicies("testdata"); err == nil || !strings.Contains(err.Error(), "base_policy.yaml:11: spec.gateways[0].basePolicy: read base policy") {
		t.Errorf("missing base: %v", err)
	}
}

// TestBasePolicyMerge: the merged policy keeps every field of the base and its
// rules first, under the base's name; the annotation numbers budget rules by
// their position among all global rules, as EG's descriptors do.
func TestBasePolicyMerge(t *testing.T) {
	res, err := Render(load(t, "testdata/base_policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	btp := res.Objects[0].Object.(*egv1a1.BackendTrafficPolicy)
	if btp.Name != "agent-router-traffic" || btp.Spec.Timeout == nil || btp.Spec.Retry == nil || btp.Spec.CircuitBreaker == nil || btp.Labels["team"] != "gateway" {
		t.Fatalf("base fields lost: %+v", btp.ObjectMeta)
	}
	rules := btp.Spec.RateLimit.Global.Rules
	if len(rules) != 7 || rules[0].ClientSelectors[0].SourceCIDR == nil || rules[2].Cost == nil {
		t.Fatalf("rules: base first, then budgets: %+v", rules)
	}
	rbs, err := RuleBudgets(btp.Annotations)
	if err != nil || len(rbs) != 5 || rbs[0].Rule != 2 || rbs[2].Principal != agentgateway.NoClaim || rbs[4].Rule != 6 || rbs[4].Kind != budgetmap.KindKillSwitch {
		t.Fatalf("rule budgets %+v, %v", rbs, err)
	}
	gc := res.Objects[2]
	if gc.Kind != "GatewayConfig" || !strings.Contains(string(gc.Manifest), "apiVersion: aigateway.envoyproxy.io/v1beta1") ||
		!strings.Contains(string(gc.Manifest), "- metadataKey: llm_total_token\n    type: TotalToken\n") {
		t.Errorf("GatewayConfig:\n%s", gc.Manifest)
	}
}

// TestBasePolicySharedByTwoGateways: two Gateways whose policies would have
// one name (a base policy file without targetRefs used by both, or a base
// named like another Gateway's rendered policy) are refused, naming the
// spec's line: one object (and one -o file) would hold only the last
// Gateway's budgets, and both would count in one rate limit domain.
func TestBasePolicySharedByTwoGateways(t *testing.T) {
	base := "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata:\n  name: %s\nspec:\n  timeout:\n    http:\n      requestTimeout: 30s\n"
	for _, tc := range []struct {
		name, gateways, baseName, want string
	}{
		{"shared base file", "    - {namespace: ns, name: gw1, basePolicy: base.yaml}\n    - {namespace: ns, name: gw2, basePolicy: base.yaml}\n",
			"traffic", "s.yaml:7: spec.gateways[1].basePolicy: the policy of Gateway ns/gw2 is ns/traffic, as is the policy of Gateway ns/gw1 (spec.gateways[0])"},
		{"base named like another policy", "    - {namespace: ns, name: gw1}\n    - {namespace: ns, name: gw2, basePolicy: base.yaml}\n",
			"s-gw1", "s.yaml:7: spec.gateways[1].basePolicy: the policy of Gateway ns/gw2 is ns/s-gw1"},
		{"another policy named like the base", "    - {namespace: ns, name: gw2, basePolicy: base.yaml}\n    - {namespace: ns, name: gw1}\n",
			"s-gw1", "s.yaml:6: spec.gateways[0].basePolicy: the policy of Gateway ns/gw1 is ns/s-gw1"},
		{"base named like an agentgateway policy", "    - {namespace: ns, name: gw1, kind: agentgateway}\n    - {namespace: ns, name: gw2, basePolicy: base.yaml}\n",
			"s-gw1", "s.yaml:7: spec.gateways[1].basePolicy: the policy of Gateway ns/gw2 is ns/s-gw1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := "apiVersion: budgetgen.dev/v1alpha1\nkind: BudgetSet\nmetadata: {name: s}\nspec:\n  gateways:\n" + tc.gateways +
				"  identities:\n    x-a: {jwtClaim: sub}\n  budgets:\n    - {name: a, perPrincipal: x-a, tokensPerDay: 1000, shadowSince: 2026-01-01}\n"
			if err := os.WriteFile(filepath.Join(dir, "s.yaml"), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "base.yaml"), fmt.Appendf(nil, base, tc.baseName), 0o644); err != nil {
				t.Fatal(err)
			}
			bs, err := spec.Load([]byte(src), "s.yaml")
			if err != nil {
				t.Fatal(err)
			}
			if err := bs.ReadBasePolicies(dir); err != nil {
				t.Fatal(err)
			}
			res, err := Render(bs)
			var pe *yamlpos.Error
			if err == nil || !errors.As(err, &pe) || !strings.HasPrefix(err.Error(), tc.want) {
				var files []string
				if res != nil {
					for name := range res.Files() {
						files = append(files, name)
					}
				}
				t.Fatalf("render = %v (files %v); want an error starting %q", err, files, tc.want)
			}
		})
	}
}
