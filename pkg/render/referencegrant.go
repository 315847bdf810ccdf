package render

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwapiv1b1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// KindReferenceGrant is the Object.Kind of the rendered ReferenceGrant.
const KindReferenceGrant = "ReferenceGrant"

// ReferenceGrantName is the name of the ReferenceGrant rendered for bs in
// the rate limit Service's namespace.
func ReferenceGrantName(bs *spec.BudgetSet) string {
	return bs.Metadata.Name + "-agentgateway-ratelimit"
}

// referenceGrant lets the AgentgatewayPolicies rendered in other namespaces
// reach the rate limit Service. agentgateway's controller checks a policy's
// cross-namespace backendRef against ReferenceGrants (v1beta1) when it runs
// with backend reference grant mode route-and-policy (the default, route,
// checks routes only). Without a grant there the policy is still Accepted,
// with reason PartiallyValid, but its rate limit has no target, and with
// FailOpen every request then passes unlimited: a budget that silently does
// not bind. The grant is harmless in the default mode, so it is rendered
// whenever an agentgateway Gateway lives outside the Service's namespace.
// It names the one Service, not every Service of the namespace.
func referenceGrant(bs *spec.BudgetSet) (Object, bool, error) {
	rs := bs.Spec.RateLimitService
	var from []gwapiv1b1.ReferenceGrantFrom
	for _, gw := range bs.Spec.Gateways {
		if !gw.IsAgentgateway() || gw.Namespace == rs.Namespace {
			continue
		}
		f := gwapiv1b1.ReferenceGrantFrom{Group: agentgateway.Group, Kind: agentgateway.KindPolicy, Namespace: gwapiv1.Namespace(gw.Namespace)}
		if !slices.Contains(from, f) {
			from = append(from, f)
		}
	}
	if len(from) == 0 {
		return Object{}, false, nil
	}
	slices.SortFunc(from, func(a, b gwapiv1b1.ReferenceGrantFrom) int {
		switch {
		case a.Namespace < b.Namespace:
			return -1
		case a.Namespace > b.Namespace:
			return 1
		}
		return 0
	})
	name := gwapiv1.ObjectName(rs.Name)
	g := &gwapiv1b1.ReferenceGrant{
		TypeMeta: metav1.TypeMeta{APIVersion: gwapiv1b1.GroupVersion.String(), Kind: KindReferenceGrant},
		ObjectMeta: metav1.ObjectMeta{
			Name:      ReferenceGrantName(bs),
			Namespace: rs.Namespace,
			Labels:    map[string]string{LabelManagedBy: ManagedByValue, LabelBudgetSet: bs.Metadata.Name},
		},
		Spec: gwapiv1b1.ReferenceGrantSpec{
			From: from,
			To:   []gwapiv1b1.ReferenceGrantTo{{Group: "", Kind: "Service", Name: &name}},
		},
	}
	o, err := newObject(KindReferenceGrant, g.Namespace, g.Name, g)
	return o, err == nil, err
}
