package render

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// unidentifiedMatches returns a rule's header matches when it is an
// unidentified requests' rule (one selector, every match an inverted
// RegularExpression ".*"), as "name" strings; ok false otherwise.
func unidentifiedMatches(r egv1a1.RateLimitRule) ([]string, bool) {
	if len(r.ClientSelectors) != 1 {
		return nil, false
	}
	var names []string
	for _, h := range r.ClientSelectors[0].Headers {
		if h.Type == nil || *h.Type != egv1a1.HeaderMatchRegularExpression || h.Value == nil || *h.Value != ".*" || h.Invert == nil || !*h.Invert {
			return nil, false
		}
		names = append(names, h.Name)
	}
	return names, len(names) > 0
}

// TestUnidentifiedRules: on the example spec each per-principal budget of
// the Envoy Gateway gets, right after its own rules (overrides included), a
// rule charging requests that carry neither x-ar-human nor x-api-key-client
// to one bucket, principal budgetgen/no-claim, with the budget's cap, cost,
// mode and reservation; promoting the budget flips it too.
func TestUnidentifiedRules(t *testing.T) {
	bs := load(t, "../../examples/budgets.yaml")
	btp := renderedBTP(t, bs)
	rules := btp.Spec.RateLimit.Global.Rules
	rbs, err := RuleBudgets(btp.Annotations)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rule, of int
		budget   string
		cap      uint32
	}{{1, 0, "per-human", 2000000}, {5, 2, "per-api-key", 1000000}} {
		r, rb := rules[tc.rule], rbs[tc.rule]
		if rb.Budget != tc.budget || rb.Principal != agentgateway.NoClaim || rb.Kind != budgetmap.KindTokens {
			t.Errorf("rule %d annotation %+v, want %s's unidentified rule", tc.rule, rb, tc.budget)
		}
		if got, ok := unidentifiedMatches(r); !ok || strings.Join(got, ",") != "x-api-key-client,x-ar-human" {
			t.Errorf("rule %d selectors %+v, want x-api-key-client and x-ar-human absent", tc.rule, r.ClientSelectors)
		}
		own := rules[tc.of]
		if r.Limit != own.Limit || r.Limit.Requests != tc.cap || !reflect.DeepEqual(r.Cost, own.Cost) || *r.Shared != true || *r.ShadowMode != *own.ShadowMode {
			t.Errorf("rule %d = %+v, want the limit, cost and mode of rule %d (%+v)", tc.rule, r, tc.of, own)
		}
	}
	m := BudgetMap(bs)
	var e *budgetmap.Entry
	for i := range m.Entries {
		if m.Entries[i].Descriptor[0].Value == budgetmap.RuleDescriptor("ai-gateway/ai-budgets-agent-router", 1) {
			e = &m.Entries[i]
		}
	}
	if e == nil || e.Budget != "per-human" || e.OverridePrincipal != agentgateway.NoClaim || e.Bucket != "ai-budgets/per-human" ||
		e.TokensPerDay != 2000000 || e.Mode != budgetmap.ModeShadow || e.Reserve == nil || !e.Reserve.Auto || e.Reserve.Initial != 20000 {
		t.Errorf("budget map entry of rule 1 = %+v, want per-human's bucket, reservation and mode, principal %s", e, agentgateway.NoClaim)
	}
	// promote per-human: its unidentified rule enforces with it, per-api-key's stays in shadow.
	bs.Spec.Budgets[2].Mode = spec.ModeEnforce
	rules = renderedBTP(t, bs).Spec.RateLimit.Global.Rules
	if *rules[1].ShadowMode || !*rules[5].ShadowMode {
		t.Errorf("after promoting per-human: shadowMode %v (per-human's) and %v (per-api-key's), want false and true", *rules[1].ShadowMode, *rules[5].ShadowMode)
	}
}

func renderedBTP(t *testing.T, bs *spec.BudgetSet) *egv1a1.BackendTrafficPolicy {
	t.Helper()
	res, err := Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	validateAll(t, res)
	for _, o := range res.Objects {
		if btp, ok := o.Object.(*egv1a1.BackendTrafficPolicy); ok {
			return btp
		}
	}
	t.Fatal("no BackendTrafficPolicy rendered")
	return nil
}

// TestUnidentifiedHeadersPerGateway: a request is unidentified on a Gateway
// when it carries none of the headers of the per-principal budgets placed
// there: group headers do not identify, another Gateway's budgets do not
// count, a header shared by two budgets is matched once, and every window of
// a budget has its own unidentified rule.
func TestUnidentifiedHeadersPerGateway(t *testing.T) {
	bs, err := spec.Load([]byte(`apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: t}
spec:
  gateways:
    - {namespace: a, name: gw-a}
    - {namespace: b, name: gw-b}
  identities:
    x-ar-human: {jwtClaim: email}
    x-api-key-client: {apiKeyClientID: true}
    x-ar-kind: {jwtClaim: kind}
  budgets:
    - {name: per-human, perPrincipal: x-ar-human, tokensPerDay: 2000000, gateways: [a/gw-a]}
    - {name: human-month, perPrincipal: x-ar-human, limits: [{tokens: 9000000, per: hour}, {tokens: 50000000, per: month}], gateways: [a/gw-a]}
    - {name: fleet, group: {header: x-ar-kind, equals: agent}, tokensPerDay: 100000000}
    - {name: per-key, perPrincipal: x-api-key-client, tokensPerDay: 1000000, mode: enforce}
`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	validateAll(t, res)
	want := map[string][]string{
		// rule: budget/window/principal [unidentified headers]
		"a": {"per-human//", "per-human//" + agentgateway.NoClaim + " [x-api-key-client x-ar-human]",
			"human-month/hour/", "human-month/month/", "human-month/hour/" + agentgateway.NoClaim + " [x-api-key-client x-ar-human]", "human-month/month/" + agentgateway.NoClaim + " [x-api-key-client x-ar-human]",
			"fleet//", "per-key//", "per-key//" + agentgateway.NoClaim + " [x-api-key-client x-ar-human]"},
		"b": {"fleet//", "per-key//", "per-key//" + agentgateway.NoClaim + " [x-api-key-client]"},
	}
	for _, o := range res.Objects {
		btp, ok := o.Object.(*egv1a1.BackendTrafficPolicy)
		if !ok {
			continue
		}
		rbs, err := RuleBudgets(btp.Annotations)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for i, rb := range rbs {
			s := rb.Budget + "/" + rb.Window + "/" + rb.Principal
			if h, ok := unidentifiedMatches(btp.Spec.RateLimit.Global.Rules[i]); ok {
				s += fmt.Sprintf(" %v", h)
			}
			got = append(got, s)
		}
		if strings.Join(got, "; ") != strings.Join(want[btp.Namespace], "; ") {
			t.Errorf("Gateway %s rules:\n got %v\nwant %v", btp.Namespace, got, want[btp.Namespace])
		}
	}
}

// perPrincipalBudgets builds a spec of n per-principal budgets on one
// Gateway, each keyed on its own header (the user owns header hygiene, so
// more than 64 identities are allowed).
func perPrincipalBudgets(n int) string {
	var b strings.Builder
	b.WriteString("apiVersion: budgetgen.dev/v1alpha1\nkind: BudgetSet\nmetadata: {name: wide}\nspec:\n  gateways: [{namespace: ai-gateway, name: agent-router}]\n  headerHygiene: {userOwned: true}\n  identities:\n")
	for i := range n {
		fmt.Fprintf(&b, "    x-id-%03d: {extAuth: true}\n", i)
	}
	b.WriteString("  budgets:\n")
	for i := range n {
		fmt.Fprintf(&b, "    - {name: b%03d, perPrincipal: x-id-%03d, tokensPerDay: 1000}\n", i, i)
	}
	return b.String()
}

// TestUnidentifiedNearRuleLimit: 128 per-principal budgets on distinct
// headers fill a policy's 256 rules, and their unidentified rules' 128
// matches fit one selector (Envoy Gateway's CRDs accept the policy); a 129th
// budget is a positioned limit error, not a policy EG refuses.
func TestUnidentifiedNearRuleLimit(t *testing.T) {
	bs, err := spec.Load([]byte(perPrincipalBudgets(128)), "wide.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rules := renderedBTP(t, bs).Spec.RateLimit.Global.Rules
	if len(rules) != MaxRulesPerPolicy {
		t.Fatalf("got %d rules, want %d", len(rules), MaxRulesPerPolicy)
	}
	if h, ok := unidentifiedMatches(rules[1]); !ok || len(h) != MaxHeadersPerSelector {
		t.Errorf("unidentified rule matches %d headers in %d selectors, want %d in one", len(h), len(rules[1].ClientSelectors), MaxHeadersPerSelector)
	}
	bs, err = spec.Load([]byte(perPrincipalBudgets(129)), "wide.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Render(bs)
	var le *LimitError
	if !errors.As(err, &le) || le.Need != 258 || !strings.HasPrefix(err.Error(), "wide.yaml:5: BackendTrafficPolicy ai-gateway/wide-agent-router: needs 258") ||
		!strings.Contains(err.Error(), "one more per window for requests without an identity header") {
		t.Errorf("129 per-principal budgets: %v, want a positioned LimitError needing 258 rules", err)
	}
}
