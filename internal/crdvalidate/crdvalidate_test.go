package crdvalidate

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	envoygateway "github.com/envoyproxy/gateway"
	"sigs.k8s.io/kubectl-validate/pkg/cmd"
	"sigs.k8s.io/kubectl-validate/pkg/openapiclient"
	"sigs.k8s.io/kubectl-validate/pkg/validator"
	"sigs.k8s.io/yaml"
)

const validBTP = `apiVersion: gateway.envoyproxy.io/v1alpha1
kind: BackendTrafficPolicy
metadata: {name: budgets, namespace: ai-gateway}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: agent-router}]
  rateLimit:
    global:
      rules:
        - clientSelectors:
            - headers:
                - {name: x-ar-run, type: Distinct}
          limit: {requests: 5000000, unit: Day}
          cost:
            request: {from: Number, number: 0}
            response: {from: Metadata, metadata: {namespace: io.envoy.ai_gateway, key: llm_total_token}}
          shared: true
          shadowMode: true
`

func TestValidate(t *testing.T) {
	v, err := Shared()
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Validate([]byte(validBTP)); err != nil {
		t.Fatalf("valid BTP rejected: %v", err)
	}
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"unknown field", strings.Replace(validBTP, "shared: true", "shared: true\n          sharedd: true", 1), []string{"spec.rateLimit.global.rules[0].sharedd", "unknown field"}},
		{"cel cost both", strings.Replace(validBTP, "{from: Number, number: 0}", "{from: Number, number: 0, metadata: {namespace: a, key: b}}", 1),
			[]string{"spec.rateLimit.global.rules[0].cost.request", "only one of number or metadata can be specified"}},
		{"enum unit", strings.Replace(validBTP, "unit: Day", "unit: Fortnight", 1), []string{"spec.rateLimit.global.rules[0].limit.unit", "Unsupported value"}},
		{"unknown kind", strings.Replace(validBTP, "BackendTrafficPolicy", "BackendTrafficPolice", 1), []string{"BackendTrafficPolice"}},
		{"gateway api", "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: ns}\nspec: {gatewayClassName: eg, listeners: []}\n", []string{"spec.listeners"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := v.Validate([]byte(tc.doc))
			if err == nil {
				t.Fatal("invalid document accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Errorf("error is %T, want *Error", err)
			}
		})
	}
}

func TestValidateObject(t *testing.T) {
	v, err := Shared()
	if err != nil {
		t.Fatal(err)
	}
	obj := map[string]any{
		"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "ClientTrafficPolicy",
		"metadata": map[string]any{"name": "c", "namespace": "n"},
		"spec": map[string]any{
			"targetRefs": []any{map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "g"}},
			"headers":    map[string]any{"earlyRequestHeaders": map[string]any{"remove": []any{"x-ar-run"}}},
		},
	}
	if err := v.ValidateObject(obj); err != nil {
		t.Fatalf("valid CTP rejected: %v", err)
	}
	obj["spec"].(map[string]any)["targetRefs"] = []any{map[string]any{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "g"}}
	err = v.ValidateObject(obj)
	if err == nil || !strings.Contains(err.Error(), "targetRefs[*].kind of Gateway") {
		t.Fatalf("CTP targeting an HTTPRoute: err = %v", err)
	}
}

// TestCachedStrategyAgreesWithKubectlValidate checks the cached per-kind
// validation, over the OpenAPI documents openapi.go builds, against
// kubectl-validate's own per-document path over its own CRD client
// (openapiclient.NewLocalCRDFiles), on valid and invalid documents: same
// verdict, same field causes.
func TestCachedStrategyAgreesWithKubectlValidate(t *testing.T) {
	v, err := Shared()
	if err != nil {
		t.Fatal(err)
	}
	ref, err := validator.New(openapiclient.NewLocalCRDFiles(fstest.MapFS{"crds.yaml": &fstest.MapFile{Data: envoygateway.GatewayCRDs, Mode: 0o444}}))
	if err != nil {
		t.Fatal(err)
	}
	docs := []string{
		validBTP,
		strings.Replace(validBTP, "shared: true", "shared: true\n          sharedd: true", 1),
		strings.Replace(validBTP, "{from: Number, number: 0}", "{from: Number, number: 0, metadata: {namespace: a, key: b}}", 1),
		strings.Replace(validBTP, "unit: Day", "unit: Fortnight", 1),
		strings.Replace(validBTP, "type: Distinct", "type: Distinct, value: x", 1),
		"apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: ns}\nspec: {gatewayClassName: eg, listeners: []}\n",
		strings.Replace(validBTP, "name: budgets,", "name: budgets, labelz: {a: b},", 1),
		strings.Replace(validBTP, "namespace: ai-gateway}", "namespace: ai-gateway, labels: {\"bad label!\": x}}", 1),
		"apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: ClientTrafficPolicy\nmetadata: {name: c, namespace: n}\nspec:\n  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: g}]\n",
	}
	for i, doc := range docs {
		want := cmd.ValidateDocument([]byte(doc), ref)
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		for path, got := range map[string]error{"Validate": v.Validate([]byte(doc)), "ValidateObject": v.ValidateObject(obj)} {
			if (got == nil) != (want == nil) {
				t.Fatalf("doc %d: %s = %v, kubectl-validate = %v", i, path, got, want)
			}
			if got == nil {
				continue
			}
			var e *Error
			if !errors.As(got, &e) || e.Err.Error() != want.Error() {
				t.Errorf("doc %d: %s error %q, kubectl-validate error %q", i, path, got, want)
			}
		}
	}
}

// BenchmarkValidateBTP shows the cost per document once the kind is compiled.
func BenchmarkValidateBTP(b *testing.B) {
	v, err := Shared()
	if err != nil {
		b.Fatal(err)
	}
	doc := []byte(validBTP)
	if err := v.Validate(doc); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := v.Validate(doc); err != nil {
			b.Fatal(err)
		}
	}
}
