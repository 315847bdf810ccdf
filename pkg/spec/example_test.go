package spec_test

import (
	"fmt"

	"github.com/budgetgen/budgetgen/pkg/spec"
)

// Load parses, defaults and validates a BudgetSet; every problem comes back
// at once, each with its file, line and field path.
func Example() {
	good := []byte(`apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: ai-budgets}
spec:
  gateways: [{namespace: ai-gateway, name: ai-gateway}]
  identities:
    x-api-key-client: {apiKeyClientID: true}
  budgets:
    - {name: per-api-key, perPrincipal: x-api-key-client, tokensPerDay: 1000000}
`)
	bs, err := spec.Load(good, "budgets.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	b := bs.Spec.Budgets[0]
	fmt.Printf("%s: %d tokens a day per %s, mode %s (the default)\n", b.Name, b.TokensPerDay, b.PerPrincipal, b.Mode)

	bad := []byte(`apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: ai-budgets}
spec:
  gateways: [{namespace: ai-gateway, name: ai-gateway}]
  budgets:
    - {name: per-api-key, perPrincipal: x-api-key-client, tokensPerDay: 1000000, mode: enforced}
`)
	_, err = spec.Load(bad, "budgets.yaml")
	fmt.Println(err)
	// Output:
	// per-api-key: 1000000 tokens a day per x-api-key-client, mode shadow (the default)
	// budgets.yaml:7: spec.budgets[0].mode: unknown mode "enforced": must be shadow or enforce
	// budgets.yaml:7: spec.budgets[0].perPrincipal: header "x-api-key-client" is not declared in spec.identities: budgets may only key on headers set from a verified credential
}
