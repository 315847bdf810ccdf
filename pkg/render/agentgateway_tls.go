package render

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// RateLimitTLSPolicyName is the name of the AgentgatewayPolicy rendered in
// the rate limit Service's namespace to set how agentgateway connects to it.
func RateLimitTLSPolicyName(bs *spec.BudgetSet) string {
	return bs.Metadata.Name + "-ratelimit-tls"
}

// rateLimitTLSPolicy is the backend TLS policy agentgateway needs to call the
// rate limit Service over TLS: an AgentgatewayPolicy targeting the Service
// (group "", kind Service) with spec.backend.tls. The global rate limit's
// backendRef has no TLS field of its own; agentgateway applies the policies
// attached to the Service it connects to. The references are local to the
// policy's namespace, which a Service-targeting policy shares with the
// Service, so the Secrets live next to the Service (where the chart's
// cert-manager Certificates write them). sni is set to
// <service>.<namespace>.svc.cluster.local, a name the chart's server
// certificate carries: agentgateway connects to a Service's endpoints by
// address (build_service_call in crates/agentgateway/src/proxy/httpproxy.rs,
// Target::Address of the workload IP), and without sni it sends and
// verifies that IP as the server name (handshake in
// crates/agentgateway/src/client/tls.rs), which no certificate for the
// Service's name matches: every call would fail, and FailOpen would admit
// every request uncounted. Nothing is rendered without an agentgateway
// Gateway or with TLS disabled.
func rateLimitTLSPolicy(bs *spec.BudgetSet) (*agentgateway.Policy, bool, error) {
	rs := bs.Spec.RateLimitService
	if rs.TLS.Mode == spec.TLSDisabled || !slices.ContainsFunc(bs.Spec.Gateways, spec.GatewayRef.IsAgentgateway) {
		return nil, false, nil
	}
	tls := &agentgateway.BackendTLS{SNI: rateLimitServiceHost(rs)}
	if rs.TLS.Mode == spec.TLSMutual {
		tls.MtlsCertificateRef = []agentgateway.LocalSecretRef{{Name: rs.TLS.ClientCertificateSecret}}
	}
	if ca := rs.TLS.CACertificate; ca != nil {
		tls.CACertificateRefs = []agentgateway.LocalCARef{{Name: ca.Name, Kind: ca.Kind}}
	}
	p := &agentgateway.Policy{
		APIVersion: agentgateway.APIVersion,
		Kind:       agentgateway.KindPolicy,
		Metadata: metav1.ObjectMeta{
			Name:      RateLimitTLSPolicyName(bs),
			Namespace: rs.Namespace,
			Labels:    map[string]string{LabelManagedBy: ManagedByValue, LabelBudgetSet: bs.Metadata.Name},
		},
		Spec: agentgateway.PolicySpec{
			TargetRefs: []agentgateway.TargetRef{{Group: "", Kind: "Service", Name: rs.Name}},
			Backend:    &agentgateway.Backend{TLS: tls},
		},
	}
	if errs := agentgateway.Validate(p); len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
		}
		return nil, false, fmt.Errorf("AgentgatewayPolicy %s/%s breaks its schema: %s", rs.Namespace, p.Metadata.Name, strings.Join(msgs, "; "))
	}
	return p, true, nil
}

func rateLimitTLSObject(bs *spec.BudgetSet) (Object, bool, error) {
	p, ok, err := rateLimitTLSPolicy(bs)
	if !ok || err != nil {
		return Object{}, ok, err
	}
	o, err := newObject(agentgateway.KindPolicy, p.Metadata.Namespace, p.Metadata.Name, p)
	return o, err == nil, err
}

// rateLimitServiceHost is the cluster DNS name of the rate limit Service,
// the name agentgateway must send and verify when it connects over TLS.
func rateLimitServiceHost(rs spec.RateLimitService) string {
	return rs.Name + "." + rs.Namespace + ".svc.cluster.local"
}
