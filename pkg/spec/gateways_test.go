package spec

import (
	"strings"
	"testing"
)

const twoKinds = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: ai-budgets}
spec:
  gateways:
    - {namespace: ai-gateway, name: agent-router}
    - {namespace: agents, name: agw, kind: agentgateway}
  identities:
    x-ar-run: {jwtClaim: run_id}
    x-api-key-client: {apiKeyClientID: true}
  budgets:
    - {name: per-run, perPrincipal: x-ar-run, tokensPerDay: 5000000, gateways: [agents/agw]}
    - {name: per-api-key, perPrincipal: x-api-key-client, tokensPerDay: 1000, gateways: [agent-router], bucket: perGateway}
`

func TestPlacementDefaultsAndLookups(t *testing.T) {
	bs, err := Load([]byte(twoKinds), "b.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if k := bs.Spec.Gateways[0].Kind; k != GatewayEnvoy {
		t.Errorf("default gateway kind = %q, want envoy", k)
	}
	rs := bs.Spec.RateLimitService
	if rs.Namespace != "envoy-gateway-system" || rs.Name != "budgetgen-ratelimit" || rs.Port != 8081 {
		t.Errorf("rateLimitService defaults = %+v", rs)
	}
	// Mutual TLS by default, with the chart's client certificate Secret,
	// whose ca.crt (written by cert-manager) verifies the service.
	if tl := rs.TLS; tl.Mode != TLSMutual || tl.ClientCertificateSecret != "budgetgen-ratelimit-agentgateway-client" ||
		tl.CACertificate == nil || *tl.CACertificate != (CertificateRef{Kind: "Secret", Name: "budgetgen-ratelimit-agentgateway-client"}) {
		t.Errorf("rateLimitService.tls defaults = %+v", tl)
	}
	if b := bs.Spec.Budgets[0].Bucket; b != BucketShared {
		t.Errorf("default bucket = %q, want shared", b)
	}
	got := bs.BudgetGateways(&bs.Spec.Budgets[0])
	if len(got) != 1 || got[0].Name != "agw" {
		t.Errorf("per-run gateways = %+v, want agents/agw only", got)
	}
	if bs.HasBudget(&bs.Spec.Budgets[1], bs.Spec.Gateways[1]) {
		t.Error("per-api-key placed on agw, want agent-router only")
	}
}

func TestPlacementErrors(t *testing.T) {
	tests := []struct{ name, from, to, want string }{
		{"unknown kind", "kind: agentgateway}", "kind: nginx}", `b.yaml:7: spec.gateways[1].kind: must be envoy or agentgateway, got "nginx"`},
		{"unknown gateway", "gateways: [agents/agw]", "gateways: [agents/nope]", `b.yaml:12: spec.budgets[0].gateways[0]: names no Gateway in spec.gateways (use <namespace>/<name>), got "agents/nope"`},
		{"bad bucket", "bucket: perGateway", "bucket: perRoute", `b.yaml:13: spec.budgets[1].bucket: must be shared or perGateway, got "perRoute"`},
		{"header identity on agentgateway", "gateways: [agent-router], bucket", "gateways: [agw], bucket",
			"b.yaml:13: spec.budgets[1].perPrincipal: budget is placed on an agentgateway Gateway, which takes the principal from a verified JWT claim: header x-api-key-client must be an identity with jwtClaim (it is apiKeyClientID)"},
		{"gateway without budget", "gateways: [agents/agw]", "gateways: [agent-router]", "b.yaml:7: spec.gateways[1]: no budget is placed on Gateway agents/agw (spec.budgets[].gateways); remove it or place a budget on it"},
		{"frontier without envoy", "    - {namespace: ai-gateway, name: agent-router}\n", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(twoKinds, tc.from, tc.to, 1)
			if tc.want == "" {
				doc = strings.Replace(doc, ", gateways: [agent-router], bucket: perGateway", "", 1)
				doc = strings.Replace(doc, "x-api-key-client: {apiKeyClientID: true}", "x-api-key-client: {jwtClaim: client}", 1)
				doc += "  frontier: {models: [gpt-5], tokensPerDay: 10}\n"
				tc.want = "b.yaml:13: spec.frontier: the frontier cap needs an Envoy Gateway Gateway (kind: envoy): agentgateway Gateways cannot match the model header"
			}
			_, err := Load([]byte(doc), "b.yaml")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error:\n got %v\nwant %s", err, tc.want)
			}
		})
	}
}

func TestRateLimitServiceTLSErrors(t *testing.T) {
	cases := map[string]struct{ rs, want string }{
		"EG's own Service": {"{namespace: envoy-gateway-system, name: envoy-ratelimit}", "spec.rateLimitService.name: envoy-gateway-system/envoy-ratelimit is the rate limit Deployment Envoy Gateway manages"},
		"bad mode":         {"{tls: {mode: strict}}", `spec.rateLimitService.tls.mode: must be mutual, server or disabled, got "strict"`},
		"server needs CA":  {"{tls: {mode: server}}", "spec.rateLimitService.tls.caCertificate: is required with mode server"},
		"client cert in server mode": {"{tls: {mode: server, clientCertificateSecret: c, caCertificate: {name: ca}}}",
			"spec.rateLimitService.tls.clientCertificateSecret: is only used with mode mutual"},
		"CA when disabled": {"{tls: {mode: disabled, caCertificate: {name: ca}}}", "spec.rateLimitService.tls.caCertificate: is not used with mode disabled"},
		"CA kind":          {"{tls: {caCertificate: {kind: Certificate, name: ca}}}", `spec.rateLimitService.tls.caCertificate.kind: must be Secret or ConfigMap, got "Certificate"`},
		"Secret name":      {"{tls: {clientCertificateSecret: Bad_Name}}", "spec.rateLimitService.tls.clientCertificateSecret: must be a DNS-1123 subdomain"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Load([]byte(twoKinds+"  rateLimitService: "+c.rs+"\n"), "b.yaml")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
	// Without an agentgateway Gateway the Service is not called: EG's own
	// name is no error there.
	if _, err := Load([]byte(base+"  rateLimitService: {name: envoy-ratelimit}\n"), "b.yaml"); err != nil {
		t.Errorf("envoy-only spec: %v", err)
	}
}
