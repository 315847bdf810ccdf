package aigateway

import (
	"testing"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// Reading is lenient (unknown fields ignored) and keeps what BG013 needs:
// parents with the route's namespace as default, non-Gateway parents
// skipped, and the cost keys of a route and a GatewayConfig.
func TestReadRouteAndGatewayConfig(t *testing.T) {
	objs, err := manifest.Parse("x.yaml", []byte(`apiVersion: aigateway.envoyproxy.io/v1alpha1
kind: AIGatewayRoute
metadata: {name: r, namespace: team}
spec:
  someFutureField: {x: 1}
  parentRefs:
    - {name: gw}
    - {name: edge, namespace: infra, kind: Gateway}
    - {name: svc, kind: Service}
  llmRequestCosts:
    - {metadataKey: llm_input_token, type: InputToken}
    - {metadataKey: spend, type: CEL, cel: "input_tokens + output_tokens"}
---
apiVersion: aigateway.envoyproxy.io/v1beta1
kind: GatewayConfig
metadata: {name: c, namespace: team}
spec:
  extProc: {kubernetes: {env: [{name: A, value: b}]}}
  globalLLMRequestCosts: [{metadataKey: llm_total_token, type: TotalToken}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: team, annotations: {aigateway.envoyproxy.io/gateway-config: c}}
`), manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := ReadRoute(objs[0])
	if len(r.Parents) != 2 || r.Parents[0].Namespace != "team" || r.Parents[1].Namespace != "infra" || r.Parents[1].Name != "edge" {
		t.Errorf("parents = %+v", r.Parents)
	}
	if !r.Writes("llm_input_token") || !r.Writes("spend") || r.Writes("llm_total_token") || r.CostsNode == nil {
		t.Errorf("route costs = %+v", r.Costs)
	}
	gc := ReadGatewayConfig(objs[1])
	if !gc.Writes("llm_total_token") || gc.Writes("llm_input_token") {
		t.Errorf("global costs = %+v", gc.Costs)
	}
	if n := GatewayConfigName(objs[2]); n != "c" {
		t.Errorf("gateway config name = %q", n)
	}
	if n := GatewayConfigName(objs[0]); n != "" {
		t.Errorf("route has no gateway config annotation, got %q", n)
	}
}
