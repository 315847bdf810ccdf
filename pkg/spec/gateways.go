package spec

import (
	"fmt"
	"slices"
)

// Defaults of spec.rateLimitService: the Service Envoy Gateway creates for its
// rate limit Deployment, so one Deployment and one Valkey serve both gateways.
const (
	DefaultRateLimitServiceNamespace = "envoy-gateway-system"
	DefaultRateLimitServiceName      = "envoy-ratelimit"
	DefaultRateLimitServicePort      = 8081
)

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
