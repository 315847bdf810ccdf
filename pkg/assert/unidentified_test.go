package assert

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// TestRouteWithoutIdentityOnUnidentifiedRules: BG012's finding about a
// route whose requests carry no identity header says, for a budget policy
// with rules for such requests (rule-budgets principal budgetgen/no-claim,
// as budgetgen renders on Envoy Gateway), that they share that one bucket
// per budget rather than spend nothing; for a policy without them it keeps
// saying they are charged to no principal's budget.
func TestRouteWithoutIdentityOnUnidentifiedRules(t *testing.T) {
	data, err := os.ReadFile("testdata/rules/bg012_route_coverage.yaml")
	if err != nil {
		t.Fatal(err)
	}
	plain := string(data)
	const meta = "metadata: {name: budgets, namespace: gw}\n"
	const rule = "          shared: true\n          shadowMode: true\n"
	withRules := strings.Replace(plain, meta, "metadata:\n  name: budgets\n  namespace: gw\n  annotations:\n    budgetgen.dev/rule-budgets: '[{\"rule\":0,\"budget\":\"per-run\",\"kind\":\"tokens\"},{\"rule\":1,\"budget\":\"per-run\",\"kind\":\"tokens\",\"principal\":\"budgetgen/no-claim\"}]'\n", 1)
	withRules = strings.Replace(withRules, rule, rule+`        - clientSelectors:
            - headers:
                - {name: x-ar-run, type: RegularExpression, value: ".*", invert: true}
          limit: {requests: 5000000, unit: Day}
          cost:
            request: {from: Number, number: 0}
            response: {from: Metadata, metadata: {namespace: io.envoy.ai_gateway, key: llm_total_token}}
`+rule, 1)
	for name, tc := range map[string]struct {
		doc, want string
	}{
		"without unidentified rules": {plain, "their requests are charged to no principal's budget;"},
		"with unidentified rules":    {withRules, "their requests are charged to no principal's budget (they share each per-principal budget's one budgetgen/no-claim bucket"},
	} {
		objs, err := manifest.Parse("f.yaml", []byte(tc.doc), manifest.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Run(context.Background(), objs, Options{Skip: []string{"BG007", "BG013"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Findings) != 1 || rep.Findings[0].Rule != "BG012" || !strings.Contains(rep.Findings[0].Message, tc.want) {
			t.Errorf("%s: findings %+v, want one BG012 saying %q", name, rep.Findings, tc.want)
		}
	}
}

// TestOptionalCredentialOnUnidentifiedRules: BG014's findings about
// requests a lax SecurityPolicy lets through without the identity header say,
// for a budget policy with rules for unidentified requests, that they share
// that one bucket per budget; for a policy without them, that they spend no
// principal's budget.
func TestOptionalCredentialOnUnidentifiedRules(t *testing.T) {
	data, err := os.ReadFile("testdata/rules/bg014_optional_jwt.yaml")
	if err != nil {
		t.Fatal(err)
	}
	plain := string(data)
	const meta = "metadata: {name: budgets, namespace: gw}\n"
	const rule = "          shared: true\n          shadowMode: true\n"
	withRules := strings.Replace(plain, meta, "metadata:\n  name: budgets\n  namespace: gw\n  annotations:\n    budgetgen.dev/rule-budgets: '[{\"rule\":0,\"budget\":\"per-run\",\"kind\":\"tokens\"},{\"rule\":1,\"budget\":\"per-run\",\"kind\":\"tokens\",\"principal\":\"budgetgen/no-claim\"}]'\n", 1)
	withRules = strings.Replace(withRules, rule, rule+`        - clientSelectors:
            - headers:
                - {name: x-ar-run, type: RegularExpression, value: ".*", invert: true}
          limit: {requests: 1000000, unit: Day}
          cost:
            request: {from: Number, number: 0}
            response: {from: Metadata, metadata: {namespace: io.envoy.ai_gateway, key: llm_total_token}}
`+rule, 1)
	for name, tc := range map[string]struct {
		doc, want string
	}{
		"without unidentified rules": {plain, "spend no principal's budget; remove"},
		"with unidentified rules":    {withRules, "spend no principal's budget (they share each per-principal budget's one budgetgen/no-claim bucket"},
	} {
		objs, err := manifest.Parse("f.yaml", []byte(tc.doc), manifest.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Run(context.Background(), objs, Options{Skip: []string{"BG007", "BG013"}})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range rep.Findings {
			if f.Rule != "BG014" {
				continue
			}
			n++
			if !strings.Contains(f.Message, tc.want) {
				t.Errorf("%s: BG014 finding %q, want it to say %q", name, f.Message, tc.want)
			}
		}
		if n != 2 {
			t.Errorf("%s: %d BG014 findings, want 2 (jwt.optional, jwt.failOpen): %+v", name, n, rep.Findings)
		}
	}
}
