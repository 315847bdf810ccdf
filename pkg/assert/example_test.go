package assert_test

import (
	"context"
	"fmt"

	"github.com/budgetgen/budgetgen/pkg/assert"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// The gate reads committed manifests with their positions and reports every
// broken invariant as a finding at the offending field: here a token budget
// whose rule is not shared, so each Envoy replica would count alone.
func Example() {
	objs, err := manifest.Parse("manifests/policies.yaml", []byte(`apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ai-gateway, namespace: ai-gateway}
spec:
  gatewayClassName: eg
  listeners: [{name: http, protocol: HTTP, port: 80}]
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: BackendTrafficPolicy
metadata: {name: ai-budgets-ai-gateway, namespace: ai-gateway}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: ai-gateway}]
  rateLimit:
    global:
      rules:
        - clientSelectors: [{headers: [{name: x-api-key-client, type: Distinct}]}]
          limit: {requests: 1000000, unit: Day}
          cost:
            request: {from: Number, number: 0}
            response: {from: Metadata, metadata: {namespace: io.envoy.ai_gateway, key: llm_total_token}}
          shadowMode: true
`), manifest.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Only the Gateway and the policy are given, so skip the rules about the
	// objects a real input holds beside them: the SecurityPolicy and
	// ClientTrafficPolicy around the identity header (BG006), the
	// AIGatewayRoutes writing the token count (BG013).
	rep, err := assert.Run(context.Background(), objs, assert.Options{Skip: []string{"BG006", "BG013"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, f := range rep.Findings {
		fmt.Printf("%s:%d:%d: %s %s: %s\n", f.File, f.Line, f.Column, f.Rule, f.Severity, f.Message)
	}
	fmt.Printf("%d objects, %d budget policy, failed: %v\n", rep.Objects, rep.BudgetPolicies, rep.Failed(assert.Error))
	// Output:
	// manifests/policies.yaml:16:11: BG001 error: token rule 0 has no shared: true: each route gets its own counter, so the budget multiplies by the routes a principal can reach
	// 2 objects, 1 budget policy, failed: true
}
