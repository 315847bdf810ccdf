package agentgateway

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestModelReadsUnstructuredPolicies(t *testing.T) {
	port := int32(8081)
	want := &Policy{APIVersion: APIVersion, Kind: KindPolicy, Metadata: metav1.ObjectMeta{Name: "p", Namespace: "agents"},
		Spec: PolicySpec{
			TargetRefs: []TargetRef{{Group: "gateway.networking.k8s.io", Kind: "Gateway", Name: "g"}},
			Traffic: &Traffic{RateLimit: &RateLimit{Global: &GlobalRateLimit{
				BackendRef: &BackendRef{Name: "rls", Namespace: "envoy-gateway-system", Port: &port}, FailureMode: FailOpen, Domain: "agents/p",
				Descriptors: []Descriptor{{Entries: []Entry{{Name: "budget", Expression: `"per-run"`}}, Unit: UnitTokens}},
			}}},
		}}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(want)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	got, ok := Model(u).(*Policy)
	if !ok {
		t.Fatalf("Model(%T) = %T, want *Policy", u, Model(u))
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Model round trip:\ngot  %+v\nwant %+v", got, want)
	}
	if Model(want) != any(want) {
		t.Error("a *Policy does not pass through as it is")
	}
	other := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "gateway.envoyproxy.io/v1alpha1", "kind": "BackendTrafficPolicy"}}
	if Model(other) != any(other) {
		t.Error("another kind is not returned as it is")
	}
	broken := &unstructured.Unstructured{Object: map[string]any{"apiVersion": APIVersion, "kind": KindPolicy, "spec": "not a mapping"}}
	if _, ok := Model(broken).(*Policy); ok {
		t.Error("a policy whose spec does not decode became a *Policy")
	}
}
