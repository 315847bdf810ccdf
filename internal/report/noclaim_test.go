package report

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// TestNoClaimIsAPrincipalOfItsBudget: the requests an Envoy Gateway budget
// charges to budgetgen/no-claim (no identity header) are reported as one
// principal of that budget, against the budget's own cap, with their
// would-be 429s, whether the service recorded them by the policy's rule
// (rule 2 here: after the default rule and the override's, no budget map)
// or by the budget's bucket (with a budget map); never as an override.
func TestNoClaimIsAPrincipalOfItsBudget(t *testing.T) {
	doc := `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: s}
spec:
  gateways: [{namespace: edge, name: gw1}]
  identities: {x-user: {jwtClaim: sub}}
  budgets:
    - {name: per-user, perPrincipal: x-user, tokensPerDay: 1000, overrides: [{principal: vip, tokensPerDay: 3000}]}
`
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	day := ledger.DayWindow(ledger.DayOf(now) - 1)
	rule := func(i string) ledger.RuleID {
		return ledger.RuleID{Domain: "edge/s-gw1", Rule: "edge/s-gw1/rule/" + i}
	}
	for name, data := range map[string][]ledger.Data{
		"policy rules": {
			{Rule: rule("0"), Window: day, Usage: map[string]uint64{"u1": 900}},
			// The unidentified rule's descriptor carries no principal value.
			{Rule: rule("2"), Window: day, Usage: map[string]uint64{"": 1500}, Denials: ledger.Denials{Shadow: 2}},
		},
		"budget map bucket": {{
			Rule: ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "s/per-user"}, Window: day,
			Usage:   map[string]uint64{"u1": 900, ledger.EncodePrincipal1(agentgateway.NoClaim): 1500},
			Denials: ledger.Denials{Shadow: 2}, PrincipalDenials: map[string]ledger.Denials{ledger.EncodePrincipal1(agentgateway.NoClaim): {Shadow: 2}},
		}},
	} {
		t.Run(name, func(t *testing.T) {
			bs, err := spec.Load([]byte(doc), "s.yaml")
			if err != nil {
				t.Fatal(err)
			}
			m, err := MappingFromSpec(bs)
			if err != nil {
				t.Fatal(err)
			}
			r, err := Build(data, m, Options{Now: now, Days: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Budgets) != 1 || r.Budgets[0].Name != "per-user" {
				t.Fatalf("budgets %+v, want per-user alone", r.Budgets)
			}
			c := r.Budgets[0].Caps[0]
			if c.Summary.Principals != 2 || c.Summary.OverCap != 1 || c.Summary.Would429 != 2 || len(c.Overridden) != 1 || c.Overridden[0].Principal != "vip" {
				t.Errorf("cap %+v, want u1 and %s in the default population, %s over with 2 would-be 429s, vip's the only override population", c, agentgateway.NoClaim, agentgateway.NoClaim)
			}
			// Its rule counts that one principal: the rule's denials are its
			// own, exactly, even where the descriptor carried no value.
			if len(c.OverCapPrincipals) != 1 || c.OverCapPrincipals[0].Principal != agentgateway.NoClaim || c.OverCapPrincipals[0].Cap != 1000 ||
				c.OverCapPrincipals[0].Would429 != 2 || !c.OverCapPrincipals[0].Would429Exact {
				t.Errorf("over the cap: %+v, want %s against the budget's 1000 with exactly 2 would-be 429s", c.OverCapPrincipals, agentgateway.NoClaim)
			}
			var buf bytes.Buffer
			if err := WriteText(&buf, r); err != nil || !strings.Contains(buf.String(), agentgateway.NoClaim) {
				t.Errorf("text report does not name %s (%v):\n%s", agentgateway.NoClaim, err, buf.String())
			}
		})
	}
}
