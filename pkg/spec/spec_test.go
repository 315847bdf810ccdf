package spec

import (
	"errors"
	"maps"
	"os"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

const base = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: ai-budgets}
spec:
  gateways: [{namespace: ai-gateway, name: agent-router}]
  identities:
    x-ar-run: {jwtClaim: run_id}
    x-api-key-client: {apiKeyClientID: true}
  budgets:
    - name: per-run
      perPrincipal: x-ar-run
      tokensPerDay: 5000000
`

func TestLoadExample(t *testing.T) {
	data, err := os.ReadFile("../../examples/budgets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bs, err := Load(data, "budgets.yaml")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := strings.Join(bs.Names(), ","); got != "per-run,agent-fleet,per-human,per-api-key,frontier" {
		t.Errorf("Names() = %s", got)
	}
	r, err := bs.Budget("per-api-key")
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != KindPerPrincipal || r.CapFor("acme-batch") != 20000000 || r.CapFor("someone") != 1000000 {
		t.Errorf("per-api-key ref = %+v", r)
	}
	if r.Path != "spec.budgets[3]" || bs.Line(r.Path) != 49 || bs.Line(r.Path+".overrides[1].tokensPerDay") != 50 {
		t.Errorf("positions: path %s line %d, override line %d", r.Path, bs.Line(r.Path), bs.Line(r.Path+".overrides[1].tokensPerDay"))
	}
	f, err := bs.Budget("frontier")
	if err != nil || f.Kind != KindFrontier || f.Frontier.Header != DefaultModelHeader || f.Rollout.Mode != ModeShadow {
		t.Errorf("frontier = %+v, %v", f, err)
	}
	g, _ := bs.Budget("agent-fleet")
	if g.Kind != KindGroup || g.Budget.Header() != "x-ar-kind" || g.Rollout.Mode != ModeShadow || g.Rollout.ShadowSince != "2026-10-16" {
		t.Errorf("agent-fleet = %+v", g.Budget)
	}
	if _, err := bs.Budget("nope"); err == nil || !strings.Contains(err.Error(), "known: [per-run") {
		t.Errorf("Budget(nope) err = %v", err)
	}
	// B1-B2 on agentgateway, B3-B5 on Envoy Gateway (the frontier cap is on
	// every Envoy Gateway Gateway).
	placed := map[string]string{}
	for _, name := range bs.Names()[:4] {
		ref, _ := bs.Budget(name)
		var ids []string
		for _, g := range bs.BudgetGateways(ref.Budget) {
			ids = append(ids, string(g.Kind)+":"+g.ID())
		}
		placed[name] = strings.Join(ids, ",")
	}
	var fr []string
	for _, g := range bs.FrontierGateways() {
		fr = append(fr, string(g.Kind)+":"+g.ID())
	}
	placed["frontier"] = strings.Join(fr, ",")
	want := map[string]string{
		"per-run": "agentgateway:agents/agent-gateway", "agent-fleet": "agentgateway:agents/agent-gateway",
		"per-human": "envoy:ai-gateway/agent-router", "per-api-key": "envoy:ai-gateway/agent-router", "frontier": "envoy:ai-gateway/agent-router",
	}
	if !maps.Equal(placed, want) {
		t.Errorf("budgets placed on %v, want %v", placed, want)
	}
	if bs.Spec.Gateways[0].GatewayConfig == nil || bs.Spec.Gateways[0].GatewayConfig.Name != "agent-router" {
		t.Errorf("the Envoy Gateway lost its gatewayConfig: %+v", bs.Spec.Gateways[0])
	}
	if bs.Spec.TokenSource != (TokenSource{DefaultTokenMetadataNamespace, DefaultTokenMetadataKey}) {
		t.Errorf("token source = %+v", bs.Spec.TokenSource)
	}
}

func TestDefaults(t *testing.T) {
	bs, err := Load([]byte(base), "b.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if bs.Spec.Budgets[0].Mode != ModeShadow {
		t.Errorf("mode = %q, want shadow", bs.Spec.Budgets[0].Mode)
	}
	if bs.Spec.TokenSource.Namespace != "io.envoy.ai_gateway" || bs.Spec.TokenSource.Key != "llm_total_token" {
		t.Errorf("token source = %+v", bs.Spec.TokenSource)
	}
}

// TestLoadErrors checks the exact file:line: path: message of each kind of bad input.
func TestLoadErrors(t *testing.T) {
	budget := func(extra string) string { return base + extra }
	tests := []struct {
		name, doc, want string
	}{
		{"empty", "", "b.yaml: empty document: expected a BudgetSet"},
		{"syntax", "apiVersion: [\n", "b.yaml:1: invalid YAML: did not find expected node content"},
		{"two docs", base + "---\nkind: x\n", "b.yaml:13: more than one YAML document: a spec file holds exactly one BudgetSet"},
		{"unknown top field", strings.Replace(base, "kind: BudgetSet", "kind: BudgetSet\nkinds: x", 1),
			"b.yaml:3: kinds: unknown field, did you mean kind? (known: apiVersion, kind, metadata, spec)"},
		{"unknown budget field", budget("      tokensPerDy: 5\n"),
			"b.yaml:13: spec.budgets[0].tokensPerDy: unknown field, did you mean tokensPerDay? (known: name, perPrincipal, group, tokensPerDay, limits, mode, shadowSince, enforcedSince, promotionReason, reserve, reserveInitial, overrides, gateways, bucket)"},
		{"wrong apiVersion", strings.Replace(base, "v1alpha1", "v1", 1), `b.yaml:1: apiVersion: must be budgetgen.dev/v1alpha1, got "budgetgen.dev/v1"`},
		{"duplicate name", budget("    - name: per-run\n      perPrincipal: x-ar-run\n      tokensPerDay: 1\n"),
			`b.yaml:13: spec.budgets[1].name: duplicate budget name "per-run" (first at spec.budgets[0])`},
		{"reserved name", budget("    - name: frontier\n      perPrincipal: x-ar-run\n      tokensPerDay: 1\n"),
			`b.yaml:13: spec.budgets[1].name: "frontier" is reserved for spec.frontier`},
		{"undeclared header", budget("    - name: per-human\n      perPrincipal: x-ar-human\n      tokensPerDay: 1\n"),
			`b.yaml:14: spec.budgets[1].perPrincipal: header "x-ar-human" is not declared in spec.identities: budgets may only key on headers set from a verified credential`},
		{"undeclared group header", budget("    - name: fleet\n      group: {header: x-ar-kind, equals: agent}\n      tokensPerDay: 1\n"),
			`b.yaml:14: spec.budgets[1].group.header: header "x-ar-kind" is not declared in spec.identities: budgets may only key on headers set from a verified credential`},
		{"zero cap", strings.Replace(base, "5000000", "0", 1), "b.yaml:12: spec.budgets[0].tokensPerDay: must be > 0 (use frontier.killSwitch to stop traffic)"},
		{"missing cap", strings.Replace(base, "      tokensPerDay: 5000000\n", "", 1), "b.yaml:10: spec.budgets[0].tokensPerDay: must be > 0 (use frontier.killSwitch to stop traffic)"},
		{"negative cap", strings.Replace(base, "5000000", "-3", 1), "b.yaml:12: spec.budgets[0].tokensPerDay: must be > 0 (use frontier.killSwitch to stop traffic)"},
		{"uint32 cap", strings.Replace(base, "5000000", "4294967296", 1), "b.yaml:12: spec.budgets[0].tokensPerDay: must be at most 4294967295 (Envoy Gateway's limit.requests is a uint32)"},
		{"string cap", strings.Replace(base, "5000000", "5M", 1), `b.yaml:12: spec.budgets[0].tokensPerDay: must be an integer, got "5M"`},
		{"bad mode", budget("      mode: enforced\n"), `b.yaml:13: spec.budgets[0].mode: unknown mode "enforced": must be shadow or enforce`},
		{"bad date", budget("      shadowSince: 2026-13-01\n"), `b.yaml:13: spec.budgets[0].shadowSince: must be a date YYYY-MM-DD, got "2026-13-01"`},
		{"bad date format", budget("      enforcedSince: 16/10/2026\n"), `b.yaml:13: spec.budgets[0].enforcedSince: must be a date YYYY-MM-DD, got "16/10/2026"`},
		{"override on group", strings.Replace(base, "x-api-key-client: {apiKeyClientID: true}", "x-api-key-client: {apiKeyClientID: true}\n    x-ar-kind: {jwtClaim: kind}", 1) +
			"    - name: fleet\n      group: {header: x-ar-kind, equals: agent}\n      tokensPerDay: 1\n      overrides: [{principal: a, tokensPerDay: 2}]\n",
			"b.yaml:17: spec.budgets[1].overrides: a group budget is one shared bucket: overrides apply to perPrincipal budgets only"},
		{"duplicate override", budget("      overrides:\n        - {principal: a, tokensPerDay: 2}\n        - {principal: a, tokensPerDay: 3}\n"),
			`b.yaml:15: spec.budgets[0].overrides[1].principal: duplicate override for "a" (first at overrides[0])`},
		{"override zero cap", budget("      overrides: [{principal: a, tokensPerDay: 0}]\n"),
			"b.yaml:13: spec.budgets[0].overrides[0].tokensPerDay: must be > 0 (use frontier.killSwitch to stop traffic)"},
		{"both kinds", budget("      group: {header: x-ar-run, equals: a}\n"), "b.yaml:10: spec.budgets[0]: set either perPrincipal or group, not both"},
		{"bad regex", base + "  frontier: {models: [\"gpt-(5\"], tokensPerDay: 10}\n",
			"b.yaml:13: spec.frontier.models[0]: invalid regular expression: error parsing regexp: missing closing ): `gpt-(5`"},
		{"frontier cap", base + "  frontier: {models: [gpt-5], killSwitch: true}\n",
			"b.yaml:13: spec.frontier.tokensPerDay: must be > 0 (use frontier.killSwitch to stop traffic)"},
		{"identity two sources", strings.Replace(base, "{apiKeyClientID: true}", "{apiKeyClientID: true, jwtClaim: sub}", 1),
			"b.yaml:8: spec.identities.x-api-key-client: must set exactly one of jwtClaim, apiKeyClientID: true, extAuth: true (the verified credential that sets the header)"},
		{"identity uppercase", strings.Replace(base, "x-api-key-client:", "X-Api-Key:", 1),
			"b.yaml:8: spec.identities.X-Api-Key: must be a lowercase HTTP header name"},
		{"duplicate key", strings.Replace(base, "metadata: {name: ai-budgets}", "metadata: {name: ai-budgets}\nmetadata: {name: x}", 1),
			"b.yaml:4: metadata: duplicate field (first at line 3)"},
		{"duplicate gateway", strings.Replace(base, "name: agent-router}]", "name: agent-router}, {namespace: ai-gateway, name: agent-router, sectionName: https}]", 1),
			"b.yaml:5: spec.gateways[1]: Gateway ai-gateway/agent-router is already listed at spec.gateways[0]: Envoy Gateway accepts one Gateway-level BackendTrafficPolicy per Gateway, so list it once"},
		{"bad section name", strings.Replace(base, "name: agent-router}", "name: agent-router, sectionName: HTTPS}", 1),
			`b.yaml:5: spec.gateways[0].sectionName: must be a DNS-1123 subdomain (lowercase letters, digits, '-', '.', at most 253), got "HTTPS"`},
		{"bad gateway name", strings.Replace(base, "name: agent-router}", "name: agent_router}", 1),
			`b.yaml:5: spec.gateways[0].name: must be a DNS-1123 subdomain (lowercase letters, digits, '-', '.', at most 253), got "agent_router"`},
		{"missing metadata name", strings.Replace(base, "metadata: {name: ai-budgets}\n", "", 1), "b.yaml:1: metadata.name: is required"},
		{"bool as string", strings.Replace(base, "apiKeyClientID: true", "apiKeyClientID: yes", 1),
			`b.yaml:8: spec.identities.x-api-key-client.apiKeyClientID: must be true or false, got "yes"`},
		{"absolute base policy", strings.Replace(base, "name: agent-router}", "name: agent-router, basePolicy: /etc/btp.yaml}", 1),
			`b.yaml:5: spec.gateways[0].basePolicy: must be a path relative to the spec file, got "/etc/btp.yaml"`},
		{"gateway config type", strings.Replace(base, "name: agent-router}", "name: agent-router, gatewayConfig: {name: gc, type: CEL}}", 1),
			`b.yaml:5: spec.gateways[0].gatewayConfig.type: must be one of TotalToken, InputToken, OutputToken, CachedInputToken, CacheCreationInputToken, ReasoningToken, got "CEL"`},
		{"gateway config namespace", strings.Replace(base, "name: agent-router}]", "name: agent-router, gatewayConfig: {name: gc}}]\n  tokenSource: {namespace: my.filter}", 1),
			`b.yaml:5: spec.gateways[0].gatewayConfig: Envoy AI Gateway writes its costs into metadata namespace io.envoy.ai_gateway, but spec.tokenSource.namespace is "my.filter"`},
		{"list expected", strings.Replace(base, "gateways: [{namespace: ai-gateway, name: agent-router}]", "gateways: agent-router", 1),
			`b.yaml:5: spec.gateways: must be a list, got "agent-router"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs, err := Load([]byte(tc.doc), "b.yaml")
			if err == nil {
				t.Fatalf("Load succeeded: %+v", bs)
			}
			if bs != nil {
				t.Errorf("Load returned a BudgetSet with an error")
			}
			if err.Error() != tc.want {
				t.Errorf("error:\n got %s\nwant %s", err, tc.want)
			}
			var fe *yamlpos.Error
			if !errors.As(err, &fe) {
				t.Errorf("error %T does not unwrap to *yamlpos.Error", err)
			}
		})
	}
}

func TestLoadReportsEveryError(t *testing.T) {
	doc := strings.Replace(base, "5000000", "0", 1) + "      mode: loud\n"
	_, err := Load([]byte(doc), "b.yaml")
	var list yamlpos.List
	if !errors.As(err, &list) || len(list) != 2 {
		t.Fatalf("want 2 errors, got %v", err)
	}
	if list[0].Line != 12 || list[1].Line != 13 {
		t.Errorf("errors not sorted by line: %v", err)
	}
}

func TestAliasBomb(t *testing.T) {
	doc := "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
	prev := "a"
	for i := 0; i < 8; i++ {
		name := string(rune('b' + i))
		doc += name + ": &" + name + " [" + strings.Repeat("*"+prev+", ", 9) + "*" + prev + "]\n"
		prev = name
	}
	doc = "apiVersion: budgetgen.dev/v1alpha1\nkind: BudgetSet\nmetadata: {name: x}\nspec:\n  budgets: [{name: x, overrides: *" + prev + "}]\n" + strings.ReplaceAll(doc, "\n", "\n")
	_, err := Load([]byte(doc), "b.yaml")
	if err == nil {
		t.Fatal("alias bomb loaded")
	}
}

func FuzzLoad(f *testing.F) {
	ex, err := os.ReadFile("../../examples/budgets.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ex)
	f.Add([]byte(base))
	f.Add([]byte(base + "  frontier: {models: [\"gpt-(5\"], tokensPerDay: 10}\n"))
	f.Add([]byte("a: &a [*a]\n"))
	f.Add([]byte("- 1\n- 2\n"))
	f.Add([]byte("spec: {budgets: [{overrides: [{principal: a, tokensPerDay: 0x10}]}]}"))
	f.Add([]byte(base + "---\nkind: [\n"))
	f.Add([]byte(base + "      limits: [{tokens: 1.5, per: day}, ~]\n      reserve: {a: b}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		bs, err := Load(data, "f.yaml")
		if err != nil {
			if bs != nil {
				t.Fatal("BudgetSet returned with an error")
			}
			var fe *yamlpos.Error
			if !errors.As(err, &fe) || fe.File != "f.yaml" || fe.Column != 0 || fe.Line > len(data)+1 { // a line ends in at least one byte
				t.Fatalf("error without its line: %v", err)
			}
			return
		}
		// A loaded spec is valid and its lookups agree with its budgets.
		if err := bs.Validate(); err != nil {
			t.Fatalf("loaded spec fails Validate: %v", err)
		}
		for _, name := range bs.Names() {
			if _, err := bs.Budget(name); err != nil {
				t.Fatal(err)
			}
		}
	})
}
