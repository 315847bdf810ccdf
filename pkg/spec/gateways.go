package spec

import (
	"fmt"
	"slices"
)

// Defaults of spec.rateLimitService: the Service of the budgetgen-ratelimit
// Helm chart (deploy/helm/budgetgen-ratelimit), installed next to Envoy
// Gateway's own rate limit Deployment so both mount one budget map and count
// in one Valkey.
const (
	DefaultRateLimitServiceNamespace = "envoy-gateway-system"
	DefaultRateLimitServiceName      = "budgetgen-ratelimit"
	DefaultRateLimitServicePort      = 8081
)

// The Service Envoy Gateway creates for its own rate limit Deployment. It
// serves gRPC with mutual TLS against Envoy Gateway's CA only, so
// agentgateway cannot call it.
const (
	EnvoyGatewayRateLimitNamespace = "envoy-gateway-system"
	EnvoyGatewayRateLimitName      = "envoy-ratelimit"
)

// ClientSecretSuffix names the chart's Secret holding agentgateway's client
// certificate: <service name>-agentgateway-client.
const ClientSecretSuffix = "-agentgateway-client"

func defaultGateways(s *BudgetSet) {
	for i := range s.Spec.Gateways {
		if s.Spec.Gateways[i].Kind == "" {
			s.Spec.Gateways[i].Kind = GatewayEnvoy
		}
	}
	rs := &s.Spec.RateLimitService
	if rs.Namespace == "" {
		rs.Namespace = DefaultRateLimitServiceNamespace
	}
	if rs.Name == "" {
		rs.Name = DefaultRateLimitServiceName
	}
	if rs.Port == 0 {
		rs.Port = DefaultRateLimitServicePort
	}
	t := &rs.TLS
	if t.Mode == "" {
		t.Mode = TLSMutual
	}
	if t.Mode == TLSMutual && t.ClientCertificateSecret == "" {
		t.ClientCertificateSecret = rs.Name + ClientSecretSuffix
	}
	if t.Mode == TLSMutual && t.CACertificate == nil {
		t.CACertificate = &CertificateRef{Kind: "Secret", Name: t.ClientCertificateSecret}
	}
	if t.CACertificate != nil && t.CACertificate.Kind == "" {
		t.CACertificate.Kind = "Secret"
	}
}

// IsAgentgateway reports whether the Gateway is enforced by an AgentgatewayPolicy.
func (g GatewayRef) IsAgentgateway() bool { return g.Kind == GatewayAgentgateway }

// ID is "<namespace>/<name>".
func (g GatewayRef) ID() string { return g.Namespace + "/" + g.Name }

// BudgetGateways returns the Gateways a budget applies to, in spec order:
// those its gateways field names, or all of them.
func (s *BudgetSet) BudgetGateways(b *Budget) []GatewayRef {
	if len(b.Gateways) == 0 {
		return s.Spec.Gateways
	}
	var out []GatewayRef
	for _, g := range s.Spec.Gateways {
		if slices.ContainsFunc(b.Gateways, func(n string) bool { return n == g.ID() || n == g.Name }) {
			out = append(out, g)
		}
	}
	return out
}

// FrontierGateways returns the Envoy Gateway Gateways, which carry the
// frontier cap (agentgateway has no model header match to render it with).
func (s *BudgetSet) FrontierGateways() []GatewayRef {
	var out []GatewayRef
	for _, g := range s.Spec.Gateways {
		if !g.IsAgentgateway() {
			out = append(out, g)
		}
	}
	return out
}

// HasBudget reports whether budget b applies to Gateway g.
func (s *BudgetSet) HasBudget(b *Budget, g GatewayRef) bool {
	return slices.Contains(s.BudgetGateways(b), g)
}

// placement checks the fields that say where budgets are enforced: gateway
// kinds, budget placement and buckets, and that budgets on agentgateway key
// only on JWT claims (its descriptors read the verified claim by CEL).
func (v *validator) placement() {
	s := v.s
	for i, g := range s.Spec.Gateways {
		if g.Kind != GatewayEnvoy && g.Kind != GatewayAgentgateway {
			v.fail(fmt.Sprintf("spec.gateways[%d].kind", i), "must be %s or %s, got %q", GatewayEnvoy, GatewayAgentgateway, g.Kind)
		}
	}
	rs := s.Spec.RateLimitService
	v.dnsLabel("spec.rateLimitService.namespace", rs.Namespace)
	v.dnsLabel("spec.rateLimitService.name", rs.Name)
	if rs.Port < 1 || rs.Port > 65535 {
		v.fail("spec.rateLimitService.port", "must be 1..65535, got %d", rs.Port)
	}
	v.rateLimitServiceTLS()
	for i := range s.Spec.Budgets {
		b := &s.Spec.Budgets[i]
		p := fmt.Sprintf("spec.budgets[%d]", i)
		v.bucket(p+".bucket", b.Bucket)
		for j, n := range b.Gateways {
			matches := 0
			for _, g := range s.Spec.Gateways {
				if n == g.ID() || n == g.Name {
					matches++
				}
			}
			switch {
			case matches == 0:
				v.fail(fmt.Sprintf("%s.gateways[%d]", p, j), "names no Gateway in spec.gateways (use <namespace>/<name>), got %q", n)
			case matches > 1:
				v.fail(fmt.Sprintf("%s.gateways[%d]", p, j), "%q names %d Gateways; use <namespace>/<name>", n, matches)
			}
		}
		onAgw := slices.ContainsFunc(s.BudgetGateways(b), GatewayRef.IsAgentgateway)
		if id, ok := s.Spec.Identities[b.Header()]; ok && onAgw && id.JWTClaim == "" {
			field := p + ".perPrincipal"
			if b.Group != nil {
				field = p + ".group.header"
			}
			v.fail(field, "budget is placed on an agentgateway Gateway, which takes the principal from a verified JWT claim: header %s must be an identity with jwtClaim (it is %s)", b.Header(), id.Source())
		}
	}
	for i, g := range s.Spec.Gateways {
		carries := s.Spec.Frontier != nil && !g.IsAgentgateway()
		for j := range s.Spec.Budgets {
			carries = carries || s.HasBudget(&s.Spec.Budgets[j], g)
		}
		if !carries && (len(s.Spec.Budgets) > 0 || s.Spec.Frontier != nil) {
			v.fail(fmt.Sprintf("spec.gateways[%d]", i), "no budget is placed on Gateway %s (spec.budgets[].gateways); remove it or place a budget on it", g.ID())
		}
	}
	if f := s.Spec.Frontier; f != nil {
		v.bucket("spec.frontier.bucket", f.Bucket)
		if len(s.FrontierGateways()) == 0 {
			v.fail("spec.frontier", "the frontier cap needs an Envoy Gateway Gateway (kind: envoy): agentgateway Gateways cannot match the model header")
		}
	}
}

func (v *validator) bucket(path string, b Bucket) {
	if b != BucketShared && b != BucketPerGateway {
		v.fail(path, "must be %s or %s, got %q", BucketShared, BucketPerGateway, b)
	}
}

// rateLimitServiceTLS checks how agentgateway reaches the service: the TLS
// mode and its Secrets, and that the Service is not Envoy Gateway's own,
// which agentgateway can never call (it requires client certificates from
// Envoy Gateway's CA).
func (v *validator) rateLimitServiceTLS() {
	s := v.s
	rs := s.Spec.RateLimitService
	t := rs.TLS
	if !slices.ContainsFunc(s.Spec.Gateways, GatewayRef.IsAgentgateway) {
		return
	}
	if rs.Namespace == EnvoyGatewayRateLimitNamespace && rs.Name == EnvoyGatewayRateLimitName {
		v.fail("spec.rateLimitService.name", "%s/%s is the rate limit Deployment Envoy Gateway manages: it requires client certificates from Envoy Gateway's own CA, which agentgateway does not hold; install the budgetgen-ratelimit Helm chart and name its Service (default %s)", rs.Namespace, rs.Name, DefaultRateLimitServiceName)
	}
	switch t.Mode {
	case TLSMutual, TLSServer, TLSDisabled:
	default:
		v.fail("spec.rateLimitService.tls.mode", "must be %s, %s or %s, got %q", TLSMutual, TLSServer, TLSDisabled, t.Mode)
	}
	if t.Mode != TLSMutual && t.ClientCertificateSecret != "" {
		v.fail("spec.rateLimitService.tls.clientCertificateSecret", "is only used with mode %s (mode is %s)", TLSMutual, t.Mode)
	}
	if t.ClientCertificateSecret != "" {
		v.subdomain("spec.rateLimitService.tls.clientCertificateSecret", t.ClientCertificateSecret, false)
	}
	switch ca := t.CACertificate; {
	case t.Mode == TLSServer && ca == nil:
		v.fail("spec.rateLimitService.tls.caCertificate", "is required with mode %s: name the ConfigMap or Secret whose ca.crt the service's certificate chains to", TLSServer)
	case t.Mode == TLSDisabled && ca != nil:
		v.fail("spec.rateLimitService.tls.caCertificate", "is not used with mode %s", TLSDisabled)
	case ca != nil:
		if ca.Kind != "Secret" && ca.Kind != "ConfigMap" {
			v.fail("spec.rateLimitService.tls.caCertificate.kind", "must be Secret or ConfigMap, got %q", ca.Kind)
		}
		v.subdomain("spec.rateLimitService.tls.caCertificate.name", ca.Name, true)
	}
}
