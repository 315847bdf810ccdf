package render_test

import (
	"fmt"
	"sort"

	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// Render turns a loaded BudgetSet into the objects that enforce it: here one
// BackendTrafficPolicy holding the budget as shared global rate limit rules
// (in shadow mode until promoted), one per principal and one for requests
// without the identity header (principal budgetgen/no-claim), and a
// ClientTrafficPolicy stripping client-sent copies of the identity header.
func Example() {
	bs, err := spec.Load([]byte(`apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: ai-budgets}
spec:
  gateways: [{namespace: ai-gateway, name: ai-gateway}]
  identities:
    x-api-key-client: {apiKeyClientID: true}
  budgets:
    - {name: per-api-key, perPrincipal: x-api-key-client, tokensPerDay: 1000000}
`), "budgets.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := render.Render(bs)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, o := range res.Objects {
		fmt.Printf("%s %s/%s\n", o.Kind, o.Namespace, o.Name)
	}
	files := res.Files()
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Println(names)
	fmt.Print(string(res.Objects[0].Manifest))
	// Output:
	// BackendTrafficPolicy ai-gateway/ai-budgets-ai-gateway
	// ClientTrafficPolicy ai-gateway/ai-budgets-ai-gateway-headers
	// [backendtrafficpolicy_ai-gateway_ai-budgets-ai-gateway.yaml clienttrafficpolicy_ai-gateway_ai-budgets-ai-gateway-headers.yaml kustomization.yaml]
	// apiVersion: gateway.envoyproxy.io/v1alpha1
	// kind: BackendTrafficPolicy
	// metadata:
	//   annotations:
	//     budgetgen.dev/rule-budgets: '[{"rule":0,"budget":"per-api-key","kind":"tokens"},{"rule":1,"budget":"per-api-key","kind":"tokens","principal":"budgetgen/no-claim"}]'
	//   labels:
	//     app.kubernetes.io/managed-by: budgetgen
	//     budgetgen.dev/budget-set: ai-budgets
	//   name: ai-budgets-ai-gateway
	//   namespace: ai-gateway
	// spec:
	//   rateLimit:
	//     global:
	//       rules:
	//       - clientSelectors:
	//         - headers:
	//           - name: x-api-key-client
	//             type: Distinct
	//         cost:
	//           request:
	//             from: Number
	//             number: 0
	//           response:
	//             from: Metadata
	//             metadata:
	//               key: llm_total_token
	//               namespace: io.envoy.ai_gateway
	//         limit:
	//           requests: 1000000
	//           unit: Day
	//         shadowMode: true
	//         shared: true
	//       - clientSelectors:
	//         - headers:
	//           - invert: true
	//             name: x-api-key-client
	//             type: RegularExpression
	//             value: .*
	//         cost:
	//           request:
	//             from: Number
	//             number: 0
	//           response:
	//             from: Metadata
	//             metadata:
	//               key: llm_total_token
	//               namespace: io.envoy.ai_gateway
	//         limit:
	//           requests: 1000000
	//           unit: Day
	//         shadowMode: true
	//         shared: true
	//   targetRefs:
	//   - group: gateway.networking.k8s.io
	//     kind: Gateway
	//     name: ai-gateway
}
