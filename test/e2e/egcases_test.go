package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// egCase is a set of policies Envoy Gateway translates in one run.
type egCase struct {
	name      string
	manifests [][]byte // BackendTrafficPolicies and ClientTrafficPolicies
	btps      []*egv1a1.BackendTrafficPolicy
	targets   []egListener // what the policies target (name "": the whole Gateway)
}

// egCases are the policy sets the test translates: the committed example
// render, every spec of pkg/render/testdata that renders Envoy Gateway
// policies, two specs at EG's limits, and internal/rlsconfig's own fixtures.
func egCases(t *testing.T) []egCase {
	t.Helper()
	example, err := filepath.Glob("../../examples/rendered/*trafficpolicy_*.yaml")
	if err != nil || len(example) != 2 {
		t.Fatalf("examples/rendered has %d traffic policies (%v), want a Backend and a ClientTrafficPolicy", len(example), err)
	}
	cases := []egCase{manifestCase(t, "example", example...)}
	specs, err := filepath.Glob("../../pkg/render/testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range specs {
		if strings.HasSuffix(p, ".golden.yaml") {
			continue
		}
		bs, err := spec.LoadFile(p, nil)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if c := renderCase(t, strings.TrimSuffix(filepath.Base(p), ".yaml"), bs); len(c.btps) > 0 {
			cases = append(cases, c)
		}
	}
	for _, c := range []egCase{
		renderCase(t, "widest", loadSpec(t, widestSpec())),
		renderCase(t, "overrides", loadSpec(t, overridesSpec())),
	} {
		if len(c.btps) != 1 {
			t.Fatalf("%s: rendered %d BackendTrafficPolicies, want 1", c.name, len(c.btps))
		}
		cases = append(cases, c)
	}
	return append(cases, manifestCase(t, "rlsconfig-selectors", "../../internal/rlsconfig/testdata/policies.yaml"))
}

// manifestCase reads the policies of YAML files (documents separated by
// "---" lines).
func manifestCase(t *testing.T, name string, files ...string) egCase {
	t.Helper()
	c := egCase{name: name}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---\n") {
			var head struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var obj any
			switch head.Kind {
			case "BackendTrafficPolicy":
				obj = &egv1a1.BackendTrafficPolicy{}
			case "ClientTrafficPolicy":
				obj = &egv1a1.ClientTrafficPolicy{}
			default:
				t.Fatalf("%s: unexpected kind %q", f, head.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			c.add([]byte(doc), obj)
		}
	}
	return c
}

// renderCase renders a spec and keeps its Envoy Gateway traffic policies.
func renderCase(t *testing.T, name string, bs *spec.BudgetSet) egCase {
	t.Helper()
	res, err := render.Render(bs)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	c := egCase{name: name}
	for _, o := range res.Objects {
		switch o.Object.(type) {
		case *egv1a1.BackendTrafficPolicy, *egv1a1.ClientTrafficPolicy:
			c.add(o.Manifest, o.Object)
		}
	}
	return c
}

// add adds a BackendTrafficPolicy or ClientTrafficPolicy to the case.
func (c *egCase) add(manifest []byte, obj any) {
	c.manifests = append(c.manifests, manifest)
	switch p := obj.(type) {
	case *egv1a1.BackendTrafficPolicy:
		c.btps = append(c.btps, p)
		c.targets = append(c.targets, policyTargets(p.Namespace, p.Spec.TargetRefs)...)
	case *egv1a1.ClientTrafficPolicy:
		c.targets = append(c.targets, policyTargets(p.Namespace, p.Spec.TargetRefs)...)
	}
}

// policyTargets are the listeners (name "": the whole Gateway) a policy's
// target references name.
func policyTargets(namespace string, refs []gwapiv1.LocalPolicyTargetReferenceWithSectionName) []egListener {
	var out []egListener
	for _, r := range refs {
		if r.Kind != "Gateway" {
			continue
		}
		l := egListener{namespace: namespace, gateway: string(r.Name)}
		if r.SectionName != nil {
			l.name = string(*r.SectionName)
		}
		out = append(out, l)
	}
	return out
}

func loadSpec(t *testing.T, src string) *spec.BudgetSet {
	t.Helper()
	bs, err := spec.Load([]byte(src), "generated.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return bs
}

// widestSpec has 128 per-principal budgets, each on its own identity header:
// 256 rules (each budget's own and its unidentified requests'), EG's limit,
// with unidentified rules matching all 128 headers in one selector. The
// headers' removal is left to the user (render removes at most 64).
func widestSpec() string {
	var b strings.Builder
	b.WriteString("apiVersion: budgetgen.dev/v1alpha1\nkind: BudgetSet\nmetadata: {name: widest}\nspec:\n" +
		"  gateways: [{namespace: ai-gateway, name: agent-router}]\n  headerHygiene: {userOwned: true}\n  identities:\n")
	for i := range 128 {
		fmt.Fprintf(&b, "    x-p-%03d: {jwtClaim: c%d}\n", i, i)
	}
	b.WriteString("  budgets:\n")
	for i := range 128 {
		mode := []string{"shadow", "enforce"}[i%2]
		fmt.Fprintf(&b, "    - {name: b-%03d, perPrincipal: x-p-%03d, tokensPerDay: %d, mode: %s}\n", i, i, 1000+i, mode)
	}
	return b.String()
}

// overridesSpec has a per-principal budget with 200 overrides: its own rule
// excludes the 200 principals with inverted Exact matches, which spill over
// two selectors (128 header matches each at most).
func overridesSpec() string {
	var b strings.Builder
	b.WriteString("apiVersion: budgetgen.dev/v1alpha1\nkind: BudgetSet\nmetadata: {name: overrides}\nspec:\n" +
		"  gateways: [{namespace: ai-gateway, name: agent-router}]\n  identities:\n    x-api-key-client: {apiKeyClientID: true}\n" +
		"  budgets:\n    - name: per-key\n      perPrincipal: x-api-key-client\n      tokensPerDay: 1000000\n      mode: enforce\n      overrides:\n")
	for i := range 200 {
		fmt.Fprintf(&b, "        - {principal: key-%03d, tokensPerDay: %d}\n", i, 2000000+i)
	}
	return b.String()
}

// ruleShapes names the shapes of a rule, for missingShapes.
func ruleShapes(r egv1a1.RateLimitRule) []string {
	var out []string
	if len(r.ClientSelectors) > 1 {
		out = append(out, "several selectors in one rule")
	}
	unidentified := 0
	for _, s := range r.ClientSelectors {
		if s.SourceCIDR != nil {
			out = append(out, "sourceCIDR (a base policy's rule)")
		}
		for _, h := range s.Headers {
			typ, inv := egv1a1.HeaderMatchExact, h.Invert != nil && *h.Invert
			if h.Type != nil {
				typ = *h.Type
			}
			switch {
			case typ == egv1a1.HeaderMatchRegularExpression && inv && h.Value != nil && *h.Value == ".*":
				unidentified++
			case typ == egv1a1.HeaderMatchRegularExpression:
				out = append(out, "RegularExpression header (frontier models)")
			case typ == egv1a1.HeaderMatchExact && inv:
				out = append(out, "inverted Exact header (a budget's rule excluding its overrides)")
			case typ == egv1a1.HeaderMatchExact:
				out = append(out, "Exact header (an override, a group)")
			case typ == egv1a1.HeaderMatchDistinct:
				out = append(out, "Distinct header (per principal)")
			}
		}
	}
	if unidentified > 1 {
		out = append(out, "inverted RegularExpression .* on every identity header, ANDed (unidentified requests)")
	}
	if r.Cost == nil || r.Cost.Response == nil {
		out = append(out, "request count, no response cost (kill switch)")
	} else if md := r.Cost.Response.Metadata; md != nil {
		out = append(out, "response cost from metadata "+md.Key)
	}
	if r.ShadowMode != nil && *r.ShadowMode {
		out = append(out, "shadowMode")
	} else {
		out = append(out, "enforced")
	}
	return append(out, "unit "+string(r.Limit.Unit))
}

// requiredShapes are the rule shapes render emits, each of which some case
// must contain.
var requiredShapes = []string{
	"Distinct header (per principal)",
	"inverted Exact header (a budget's rule excluding its overrides)",
	"Exact header (an override, a group)",
	"inverted RegularExpression .* on every identity header, ANDed (unidentified requests)",
	"RegularExpression header (frontier models)",
	"request count, no response cost (kill switch)",
	"response cost from metadata llm_total_token",
	"response cost from metadata budgetgen_cost",
	"response cost from metadata budgetgen_total_ktokens",
	"several selectors in one rule",
	"sourceCIDR (a base policy's rule)",
	"shadowMode", "enforced",
	"unit Hour", "unit Day", "unit Week", "unit Month",
	"256 rules in one policy",
}

// missingShapes lists the required shapes no rule of btps has.
func missingShapes(btps []*egv1a1.BackendTrafficPolicy) []string {
	seen := map[string]bool{}
	for _, p := range btps {
		if p.Spec.RateLimit == nil || p.Spec.RateLimit.Global == nil {
			continue
		}
		rules := p.Spec.RateLimit.Global.Rules
		if len(rules) == 256 {
			seen["256 rules in one policy"] = true
		}
		for _, r := range rules {
			for _, s := range ruleShapes(r) {
				seen[s] = true
			}
		}
	}
	var out []string
	for _, s := range requiredShapes {
		if !seen[s] {
			out = append(out, s)
		}
	}
	return out
}
