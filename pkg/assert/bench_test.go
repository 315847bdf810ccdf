package assert_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/assert"
	"github.com/budgetgen/budgetgen/pkg/assert/crd"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// benchManifests is 1,000 objects: 200 tenants, each with a Gateway, an
// AIGatewayRoute writing the token count (BG013), a SecurityPolicy on the
// Gateway (JWT claims to headers), a ClientTrafficPolicy
// and a budget BackendTrafficPolicy of 6 token rules (a Distinct per-user
// budget with 2 excluded overrides, the overrides, a group and a model cap).
func benchManifests() []byte {
	var b strings.Builder
	rule := func(sel string, requests int) string {
		return fmt.Sprintf(`        - clientSelectors: [{headers: [%s]}]
          limit: {requests: %d, unit: Day}
          cost:
            request: {from: Number, number: 0}
            response: {from: Metadata, metadata: {namespace: io.envoy.ai_gateway, key: llm_total_token}}
          shared: true
          shadowMode: true
`, sel, requests)
	}
	for i := 0; i < 200; i++ {
		ns := fmt.Sprintf("tenant-%03d", i)
		fmt.Fprintf(&b, `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ai, namespace: %[1]s, labels: {tier: ai}}
spec:
  gatewayClassName: eg
  listeners: [{name: http, protocol: HTTP, port: 80}]
---
apiVersion: aigateway.envoyproxy.io/v1beta1
kind: AIGatewayRoute
metadata: {name: chat, namespace: %[1]s}
spec:
  parentRefs: [{name: ai, kind: Gateway, group: gateway.networking.k8s.io}]
  rules: [{backendRefs: [{name: llm}]}]
  llmRequestCosts: [{metadataKey: llm_input_token, type: InputToken}, {metadataKey: llm_total_token, type: TotalToken}]
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: SecurityPolicy
metadata: {name: jwt, namespace: %[1]s}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: ai}]
  jwt:
    providers:
      - name: idp
        remoteJWKS: {uri: "https://idp.example.com/jwks"}
        claimToHeaders: [{claim: sub, header: x-user}, {claim: team, header: x-team}]
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: ClientTrafficPolicy
metadata: {name: hygiene, namespace: %[1]s}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: ai}]
  headers: {earlyRequestHeaders: {remove: [x-user, x-team]}}
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: BackendTrafficPolicy
metadata: {name: budgets, namespace: %[1]s}
spec:
  targetSelectors: [{kind: Gateway, matchLabels: {tier: ai}}]
  rateLimit:
    global:
      rules:
`, ns)
		b.WriteString(rule(`{name: x-user, type: Distinct}, {name: x-user, type: Exact, value: big, invert: true}, {name: x-user, type: RegularExpression, value: "batch-[0-9]+", invert: true}`, 1000000))
		b.WriteString(rule(`{name: x-user, type: Exact, value: big}`, 20000000))
		b.WriteString(rule(`{name: x-user, type: Exact, value: batch-1}`, 5000000))
		b.WriteString(rule(`{name: x-team, type: Distinct}`, 50000000))
		b.WriteString(rule(`{name: x-team, type: Exact, value: platform}`, 10000000))
		b.WriteString(rule(`{name: x-ai-eg-model, type: RegularExpression, value: "gpt-5.*"}`, 50000000))
		b.WriteString("---\n")
	}
	return []byte(b.String())
}

func benchAssert(b *testing.B, opts assert.Options) {
	data := benchManifests()
	ctx := context.Background()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		objs, err := manifest.Parse("bench.yaml", data, manifest.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if len(objs) != 1000 {
			b.Fatalf("%d objects, want 1000", len(objs))
		}
		rep, err := assert.Run(ctx, objs, opts)
		if err != nil {
			b.Fatal(err)
		}
		if len(rep.Findings) != 0 {
			b.Fatalf("benchmark input has findings: %+v", rep.Findings[0])
		}
	}
}

// BenchmarkAssert1000: read and assert 1,000 manifests (200 budget policies),
// every rule but the schema check.
func BenchmarkAssert1000(b *testing.B) {
	benchAssert(b, assert.Options{EnvoyGatewayVersion: "v1.9.1"})
}

// BenchmarkAssert1000WithSchema adds BG007 (EG's CRD schema and CEL through
// kubectl-validate) for every object; the validator is built once, outside the loop.
func BenchmarkAssert1000WithSchema(b *testing.B) {
	v, err := crd.Validator()
	if err != nil {
		b.Fatal(err)
	}
	benchAssert(b, assert.Options{EnvoyGatewayVersion: "v1.9.1", Validator: v})
}

// TestBenchInputIsClean keeps the benchmark honest: its input must pass every
// rule, schema included, so the benchmark measures a full clean run.
func TestBenchInputIsClean(t *testing.T) {
	objs, err := manifest.Parse("bench.yaml", benchManifests(), manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := assert.Run(context.Background(), objs, assert.Options{EnvoyGatewayVersion: "v1.9.1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		t.Errorf("%d:%d %s %s", f.Line, f.Column, f.Rule, f.Message)
	}
	// Schema and CEL on one tenant (the other 199 are the same shapes):
	// kubectl-validate costs ~35 ms per object (see docs/benchmarks.md).
	v, err := crd.Validator()
	if err != nil {
		t.Fatal(err)
	}
	rep, err = assert.Run(context.Background(), objs[:5], assert.Options{Validator: v})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		t.Errorf("schema: %d:%d %s %s", f.Line, f.Column, f.Rule, f.Message)
	}
	pols := 0
	for _, o := range objs {
		if o.Kind == "BackendTrafficPolicy" {
			pols++
		}
	}
	if len(objs) != 1000 || pols != 200 {
		t.Errorf("%d objects, %d policies", len(objs), pols)
	}
}
