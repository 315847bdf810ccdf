package render

import (
	"strings"
	"testing"

	gwapiv1b1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/budgetgen/budgetgen/internal/crdvalidate"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// TestReferenceGrant: one grant in the rate limit Service's namespace lets
// the AgentgatewayPolicies of every other namespace (sorted, once each) reach
// that one Service; none when every agentgateway Gateway shares the
// Service's namespace; the grant validates against the Gateway API CRD.
func TestReferenceGrant(t *testing.T) {
	const head = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: s}
spec:
  identities: {x-run: {jwtClaim: run_id}}
  budgets:
    - {name: per-run, perPrincipal: x-run, tokensPerDay: 1000}
`
	v, err := crdvalidate.Shared()
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		gateways string
		want     []string // from namespaces; nil: no grant
	}{
		"two namespaces": {"  gateways:\n    - {namespace: team-b, name: agw1, kind: agentgateway}\n    - {namespace: agents, name: agw2, kind: agentgateway}\n    - {namespace: agents, name: agw3, kind: agentgateway}\n    - {namespace: edge, name: eg}\n", []string{"agents", "team-b"}},
		"same namespace": {"  gateways:\n    - {namespace: envoy-gateway-system, name: agw, kind: agentgateway}\n", nil},
		"envoy only":     {"  gateways:\n    - {namespace: edge, name: eg}\n", nil},
	} {
		t.Run(name, func(t *testing.T) {
			bs, err := spec.Load([]byte(head+tc.gateways), "s.yaml")
			if err != nil {
				t.Fatal(err)
			}
			res, err := Render(bs)
			if err != nil {
				t.Fatal(err)
			}
			var grants []*gwapiv1b1.ReferenceGrant
			for _, o := range res.Objects {
				if g, ok := o.Object.(*gwapiv1b1.ReferenceGrant); ok {
					grants = append(grants, g)
					if err := v.Validate(o.Manifest); err != nil {
						t.Errorf("ReferenceGrant does not validate against the Gateway API CRD: %v", err)
					}
				}
			}
			if tc.want == nil {
				if len(grants) != 0 {
					t.Fatalf("%d grants, want none", len(grants))
				}
				return
			}
			if len(grants) != 1 {
				t.Fatalf("%d grants, want 1", len(grants))
			}
			g := grants[0]
			if g.Namespace != "envoy-gateway-system" || g.Name != "s-agentgateway-ratelimit" || g.APIVersion != "gateway.networking.k8s.io/v1beta1" {
				t.Errorf("grant %s %s/%s", g.APIVersion, g.Namespace, g.Name)
			}
			var from []string
			for _, f := range g.Spec.From {
				if f.Group != "agentgateway.dev" || f.Kind != "AgentgatewayPolicy" {
					t.Errorf("from %+v", f)
				}
				from = append(from, string(f.Namespace))
			}
			if strings.Join(from, ",") != strings.Join(tc.want, ",") {
				t.Errorf("from namespaces %v, want %v", from, tc.want)
			}
			if len(g.Spec.To) != 1 || g.Spec.To[0].Kind != "Service" || g.Spec.To[0].Group != "" || g.Spec.To[0].Name == nil || *g.Spec.To[0].Name != "budgetgen-ratelimit" {
				t.Errorf("to %+v: want the one rate limit Service", g.Spec.To)
			}
		})
	}
}
