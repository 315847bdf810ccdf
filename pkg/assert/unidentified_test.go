package assert

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// withUnidentifiedRule reads a rule fixture whose budget policy has one
// per-principal rule (per-run on x-ar-run) and returns it as is and with the
// rule budgetgen renders on Envoy Gateway for requests without an identity
// header (rule-budgets principal budgetgen/no-claim) added after it, with
// the given daily limit.
func withUnidentifiedRule(t *testing.T, fixture string, limit int) (plain, withRules string) {
	t.Helper()
	data, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	plain = string(data)
	const meta = "metadata: {name: budgets, namespace: gw}\n"
	const rule = "          shared: true\n          shadowMode: true\n"
	withRules = strings.Replace(plain, meta, "metadata:\n  name: budgets\n  namespace: gw\n  annotations:\n    budgetgen.dev/rule-budgets: '[{\"rule\":0,\"budget\":\"per-run\",\"kind\":\"tokens\"},{\"rule\":1,\"budget\":\"per-run\",\"kind\":\"tokens\",\"principal\":\"budgetgen/no-claim\"}]'\n", 1)
	withRules = strings.Replace(withRules, rule, rule+fmt.Sprintf(`        - clientSelectors:
            - headers:
                - {name: x-ar-run, type: RegularExpression, value: ".*", invert: true}
          limit: {requests: %d, unit: Day}
          cost:
            request: {from: Number, number: 0}
            response: {from: Metadata, metadata: {namespace: io.envoy.ai_gateway, key: llm_total_token}}
`, limit)+rule, 1)
	return plain, withRules
}

// gateFindings runs the gate on doc (BG007 and BG013 skipped: the fixtures
// are about identity) and returns its findings.
func gateFindings(t *testing.T, doc string) []Finding {
	t.Helper()
	objs, err := manifest.Parse("f.yaml", []byte(doc), manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), objs, Options{Skip: []string{"BG007", "BG013"}})
	if err != nil {
		t.Fatal(err)
	}
	return rep.Findings
}

// TestRouteWithoutIdentityOnUnidentifiedRules: BG012's finding about a
// route whose requests carry no identity header says, for a budget policy
// with rules for such requests (rule-budgets principal budgetgen/no-claim,
// as budgetgen renders on Envoy Gateway), that they share that one bucket
// per budget rather than spend nothing; for a policy without them it keeps
// saying they are charged to no principal's budget.
func TestRouteWithoutIdentityOnUnidentifiedRules(t *testing.T) {
	plain, withRules := withUnidentifiedRule(t, "testdata/rules/bg012_route_coverage.yaml", 5000000)
	for name, tc := range map[string]struct {
		doc, want string
	}{
		"without unidentified rules": {plain, "their requests are charged to no principal's budget;"},
		"with unidentified rules":    {withRules, "their requests are charged to no principal's budget (they share each per-principal budget's one budgetgen/no-claim bucket"},
	} {
		if fs := gateFindings(t, tc.doc); len(fs) != 1 || fs[0].Rule != "BG012" || !strings.Contains(fs[0].Message, tc.want) {
			t.Errorf("%s: findings %+v, want one BG012 saying %q", name, fs, tc.want)
		}
	}
}

// TestOptionalCredentialOnUnidentifiedRules: BG014's findings about
// requests a lax SecurityPolicy lets through without the identity header say,
// for a budget policy with rules for unidentified requests, that they share
// that one bucket per budget; for a policy without them, that they spend no
// principal's budget.
func TestOptionalCredentialOnUnidentifiedRules(t *testing.T) {
	plain, withRules := withUnidentifiedRule(t, "testdata/rules/bg014_optional_jwt.yaml", 1000000)
	for name, tc := range map[string]struct {
		doc, want string
	}{
		"without unidentified rules": {plain, "spend no principal's budget; remove"},
		"with unidentified rules":    {withRules, "spend no principal's budget (they share each per-principal budget's one budgetgen/no-claim bucket"},
	} {
		n := 0
		for _, f := range gateFindings(t, tc.doc) {
			if f.Rule != "BG014" {
				continue
			}
			n++
			if !strings.Contains(f.Message, tc.want) {
				t.Errorf("%s: BG014 finding %q, want it to say %q", name, f.Message, tc.want)
			}
		}
		if n != 2 {
			t.Errorf("%s: %d BG014 findings, want 2 (jwt.optional, jwt.failOpen)", name, n)
		}
	}
}
