package agentgateway

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func backendPolicy(tls *BackendTLS) *Policy {
	return &Policy{
		APIVersion: APIVersion, Kind: KindPolicy,
		Metadata: metav1.ObjectMeta{Name: "rls-tls", Namespace: "envoy-gateway-system"},
		Spec: PolicySpec{
			TargetRefs: []TargetRef{{Group: "", Kind: "Service", Name: "budgetgen-ratelimit"}},
			Backend:    &Backend{TLS: tls},
		},
	}
}

// The CRD's rules on a Service-targeted backend TLS policy
// (agentgateway_policy_types.go BackendTLS, LocalSecretObjectRef,
// LocalCACertificateRef; the spec-level targetRefs rule).
func TestValidateBackendTLS(t *testing.T) {
	ok := &BackendTLS{MtlsCertificateRef: []LocalSecretRef{{Name: "c"}}, CACertificateRefs: []LocalCARef{{Name: "c", Kind: CAKindSecret}}}
	if errs := Validate(backendPolicy(ok)); len(errs) > 0 {
		t.Fatalf("valid policy: %v", errs)
	}
	cases := map[string]struct {
		mutate func(*Policy)
		want   string
	}{
		"tls required": {func(p *Policy) { p.Spec.Backend.TLS = nil }, "spec.backend.tls: is required"},
		"two certs": {func(p *Policy) {
			p.Spec.Backend.TLS.MtlsCertificateRef = append(p.Spec.Backend.TLS.MtlsCertificateRef, LocalSecretRef{Name: "d"})
		}, "mtlsCertificateRef: at most 1 item"},
		"CA kind":      {func(p *Policy) { p.Spec.Backend.TLS.CACertificateRefs[0].Kind = "Certificate" }, `caCertificateRefs[0].kind: must be ConfigMap or Secret, got "Certificate"`},
		"name length":  {func(p *Policy) { p.Spec.Backend.TLS.CACertificateRefs[0].Name = "" }, "caCertificateRefs[0].name: is required"},
		"custom ref":   {func(p *Policy) { p.Spec.Backend.TLS.MtlsCertificateRef[0].Kind = "Vault" }, "custom credential refs must set both group and kind"},
		"sni":          {func(p *Policy) { p.Spec.Backend.TLS.SNI = "Not_A_Name" }, "spec.backend.tls.sni: must be a DNS name"},
		"target kind":  {func(p *Policy) { p.Spec.TargetRefs[0].Kind = "ConfigMap" }, "targetRefs may only reference"},
		"with traffic": {func(p *Policy) { p.Spec.Traffic = &Traffic{} }, "spec.backend: budgetgen renders backend settings in a policy of their own"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			p := backendPolicy(&BackendTLS{MtlsCertificateRef: []LocalSecretRef{{Name: "c"}}, CACertificateRefs: []LocalCARef{{Name: "c", Kind: CAKindSecret}}})
			c.mutate(p)
			var msgs []string
			for _, e := range Validate(p) {
				msgs = append(msgs, e.Error())
			}
			if got := strings.Join(msgs, "; "); !strings.Contains(got, c.want) {
				t.Errorf("errors %q, want %q", got, c.want)
			}
		})
	}
}
