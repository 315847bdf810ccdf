package render

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// validateAgentgateway checks a rendered AgentgatewayPolicy against the CRD's
// schema rules: its manifest decodes strictly into the modelled fields and
// passes agentgateway.Validate.
func validateAgentgateway(t *testing.T, o Object) {
	t.Helper()
	var p agentgateway.Policy
	if err := yaml.UnmarshalStrict(o.Manifest, &p); err != nil {
		t.Errorf("AgentgatewayPolicy %s/%s manifest has fields outside the model: %v", o.Namespace, o.Name, err)
		return
	}
	for _, e := range agentgateway.Validate(&p) {
		t.Errorf("AgentgatewayPolicy %s/%s: %v", o.Namespace, o.Name, e)
	}
}

func TestAgentgatewayPolicyShape(t *testing.T) {
	bs := load(t, "testdata/mixed_gateways.yaml")
	res, err := Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	var agw *agentgateway.Policy
	for _, o := range res.Objects {
		kinds = append(kinds, o.Kind+" "+o.Namespace+"/"+o.Name)
		if p, ok := agentgateway.Model(o.Object).(*agentgateway.Policy); ok && p.Spec.Traffic != nil {
			agw = p
		}
	}
	want := "BackendTrafficPolicy ai-gateway/ai-budgets-agent-router,ClientTrafficPolicy ai-gateway/ai-budgets-agent-router-headers,AgentgatewayPolicy agents/ai-budgets-agent-gw,ReferenceGrant envoy-gateway-system/ai-budgets-agentgateway-ratelimit,AgentgatewayPolicy envoy-gateway-system/ai-budgets-ratelimit-tls"
	if got := strings.Join(kinds, ","); got != want {
		t.Fatalf("objects = %s\nwant %s", got, want)
	}
	g := agw.Spec.Traffic.RateLimit.Global
	if g.FailureMode != agentgateway.FailOpen {
		t.Errorf("failureMode = %q, want FailOpen (the CRD defaults to FailClosed)", g.FailureMode)
	}
	if g.Domain != "agents/ai-budgets-agent-gw" {
		t.Errorf("domain = %q", g.Domain)
	}
	if b := g.BackendRef; b == nil || b.Name != "budgetgen-ratelimit" || b.Namespace != "envoy-gateway-system" || b.Port == nil || *b.Port != 8081 {
		t.Errorf("backendRef = %+v", b)
	}
	// Only the budgets placed on agent-gw, each Tokens, principal from the JWT.
	if len(g.Descriptors) != 2 {
		t.Fatalf("descriptors = %+v, want per-run and agent-fleet", g.Descriptors)
	}
	for _, d := range g.Descriptors {
		if d.Unit != agentgateway.UnitTokens || d.Cost != agentgateway.CostTotalTokens {
			t.Errorf("descriptor %+v: want unit Tokens and the cost %q", d, agentgateway.CostTotalTokens)
		}
		vars, err := agentgateway.Variables(d.Entries[1].Expression)
		if err != nil || len(vars) != 1 || vars[0] != "jwt" {
			t.Errorf("principal expression %q reads %v (err %v), want jwt only", d.Entries[1].Expression, vars, err)
		}
	}
	// The EG policy holds only its own budgets: per-api-key (+1 override, +its
	// rule for requests without an identity header) and the frontier cap (+kill switch).
	rbs, err := RuleBudgets(res.Objects[0].Object.(interface{ GetAnnotations() map[string]string }).GetAnnotations())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, rb := range rbs {
		names = append(names, rb.Budget)
	}
	if got := strings.Join(names, ","); got != "per-api-key,per-api-key,per-api-key,frontier,frontier" {
		t.Errorf("EG rule budgets = %s", got)
	}
	// The RLS config of the agentgateway domain holds the caps and modes.
	if len(res.AgentgatewayConfigs) != 1 {
		t.Fatalf("agentgateway configs = %d, want 1", len(res.AgentgatewayConfigs))
	}
	c := res.AgentgatewayConfigs[0]
	if c.Domain != g.Domain || len(c.Descriptors) != 2 {
		t.Fatalf("config %+v", c)
	}
	run := c.Descriptors[0]
	if run.Key != "budget" || run.Value != "per-run" || len(run.Descriptors) != 2 ||
		run.Descriptors[0].Key != "principal" || run.Descriptors[0].Value != "" || run.Descriptors[0].RateLimit.RequestsPerUnit != 5000000 || !run.Descriptors[0].ShadowMode ||
		run.Descriptors[1].Value != "run-big" || run.Descriptors[1].RateLimit.RequestsPerUnit != 9000000 {
		t.Errorf("per-run config = %+v", run)
	}
	fleet := c.Descriptors[1].Descriptors[0]
	if fleet.Key != "group" || fleet.Value != "agent" || fleet.ShadowMode || fleet.RateLimit.RequestsPerUnit != 200000000 {
		t.Errorf("agent-fleet (enforce) config = %+v", fleet)
	}
}

func TestAgentgatewayDescriptorLimit(t *testing.T) {
	var b strings.Builder
	b.WriteString("apiVersion: budgetgen.dev/v1alpha1\nkind: BudgetSet\nmetadata: {name: s}\nspec:\n  gateways: [{namespace: a, name: g, kind: agentgateway}]\n  identities: {x-u: {jwtClaim: sub}}\n  budgets:\n")
	for i := range agentgateway.MaxDescriptors + 1 {
		fmt.Fprintf(&b, "    - {name: b%d, perPrincipal: x-u, tokensPerDay: 10}\n", i)
	}
	bs, err := spec.Load([]byte(b.String()), "s.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Render(bs)
	if err == nil || !strings.Contains(err.Error(), "needs 17, Envoy Gateway allows descriptors per global rate limit of an AgentgatewayPolicy (max 16)") {
		t.Errorf("error = %v", err)
	}
}

func TestAgentgatewaySchemaRules(t *testing.T) {
	res, err := Render(load(t, "testdata/mixed_gateways.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	fresh := func() *agentgateway.Policy {
		var p agentgateway.Policy
		if err := yaml.UnmarshalStrict(res.Objects[2].Manifest, &p); err != nil {
			t.Fatal(err)
		}
		return &p
	}
	if errs := agentgateway.Validate(fresh()); len(errs) != 0 {
		t.Fatalf("rendered policy invalid: %v", errs)
	}
	tests := []struct {
		name    string
		breakIt func(*agentgateway.Policy)
		want    string
	}{
		{"failure mode enum", func(p *agentgateway.Policy) { p.Spec.Traffic.RateLimit.Global.FailureMode = "Open" }, `spec.traffic.rateLimit.global.failureMode: must be FailClosed or FailOpen, got "Open"`},
		{"unit enum", func(p *agentgateway.Policy) { p.Spec.Traffic.RateLimit.Global.Descriptors[0].Unit = "tokens" }, `descriptors[0].unit: must be Requests or Tokens, got "tokens"`},
		{"domain required", func(p *agentgateway.Policy) { p.Spec.Traffic.RateLimit.Global.Domain = "" }, "global.domain: is required, 1..256 characters, got 0"},
		{"domain length", func(p *agentgateway.Policy) { p.Spec.Traffic.RateLimit.Global.Domain = strings.Repeat("d", 257) }, "global.domain: is required, 1..256 characters, got 257"},
		{"descriptors max items", func(p *agentgateway.Policy) {
			g := p.Spec.Traffic.RateLimit.Global
			for len(g.Descriptors) <= agentgateway.MaxDescriptors {
				g.Descriptors = append(g.Descriptors, g.Descriptors[0])
			}
		}, "global.descriptors: must have 1..16 items, got 17"},
		{"entries min items", func(p *agentgateway.Policy) { p.Spec.Traffic.RateLimit.Global.Descriptors[0].Entries = nil }, "descriptors[0].entries: must have 1..16 items, got 0"},
		{"entry name length", func(p *agentgateway.Policy) {
			p.Spec.Traffic.RateLimit.Global.Descriptors[0].Entries[0].Name = strings.Repeat("n", 65)
		}, "entries[0].name: is required, 1..64 characters, got 65"},
		{"expression is CEL", func(p *agentgateway.Policy) {
			p.Spec.Traffic.RateLimit.Global.Descriptors[0].Entries[1].Expression = "jwt[\"sub\""
		}, "entries[1].expression: not a valid CEL expression"},
		{"backendRef xor url", func(p *agentgateway.Policy) { p.Spec.Traffic.RateLimit.Global.URL = "http://rls:8081" }, "exactly one of the fields in [backendRef url] must be set"},
		{"service port required", func(p *agentgateway.Policy) { p.Spec.Traffic.RateLimit.Global.BackendRef.Port = nil }, "Must have port for Service reference"},
		{"target kind", func(p *agentgateway.Policy) { p.Spec.TargetRefs[0].Kind = "Service" }, "a traffic policy can only target"},
		{"target refs max items", func(p *agentgateway.Policy) {
			for len(p.Spec.TargetRefs) <= agentgateway.MaxTargetRefs {
				p.Spec.TargetRefs = append(p.Spec.TargetRefs, p.Spec.TargetRefs[0])
			}
		}, "spec.targetRefs: at most 16 items, got 17"},
		{"refs xor selectors: both", func(p *agentgateway.Policy) {
			p.Spec.TargetSelectors = []agentgateway.TargetSelector{{Group: "gateway.networking.k8s.io", Kind: "Gateway", MatchLabels: map[string]string{"a": "b"}}}
		}, "exactly one of targetRefs and targetSelectors is required"},
		{"refs xor selectors: neither", func(p *agentgateway.Policy) { p.Spec.TargetRefs = nil }, "exactly one of targetRefs and targetSelectors is required"},
		{"selector matchLabels required", func(p *agentgateway.Policy) {
			p.Spec.TargetRefs = nil
			p.Spec.TargetSelectors = []agentgateway.TargetSelector{{Group: "gateway.networking.k8s.io", Kind: "Gateway"}}
		}, "spec.targetSelectors[0]: group, kind and matchLabels are required"},
		{"selector kind", func(p *agentgateway.Policy) {
			p.Spec.TargetRefs = nil
			p.Spec.TargetSelectors = []agentgateway.TargetSelector{{Kind: "Service", MatchLabels: map[string]string{}}}
		}, "spec.targetSelectors[0]: a traffic policy can only target"},
	}
	valid := fresh()
	valid.Spec.TargetRefs = nil
	valid.Spec.TargetSelectors = []agentgateway.TargetSelector{{Group: "gateway.networking.k8s.io", Kind: "Gateway", MatchLabels: map[string]string{"tier": "agents"}}}
	if errs := agentgateway.Validate(valid); len(errs) != 0 {
		t.Fatalf("a policy with targetSelectors instead of targetRefs is valid in the CRD: %v", errs)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := fresh()
			tc.breakIt(p)
			errs := agentgateway.Validate(p)
			var all []string
			for _, e := range errs {
				all = append(all, e.Error())
			}
			if !strings.Contains(strings.Join(all, "\n"), tc.want) {
				t.Errorf("errors %v do not contain %q", all, tc.want)
			}
		})
	}
}

// TestAgentgatewayRefusesCapsItCannotExpress: token caps of an hour, day,
// week or month within uint32 are accepted; money, caps past uint32 and no
// cap are refused with the reason, never rendered with a 0 (deny-all once
// enforced) or truncated cap.
func TestAgentgatewayRefusesCapsItCannotExpress(t *testing.T) {
	for name, tc := range map[string]struct {
		tokensPerDay int64
		limits       []spec.Limit
		want         string // "" = accepted, else a substring of the error
		caps         map[spec.Period]int64
	}{
		"tokensPerDay":       {tokensPerDay: 5000000, caps: map[spec.Period]int64{spec.PeriodDay: 5000000}},
		"one daily limit":    {limits: []spec.Limit{{Tokens: 7000, Per: spec.PeriodDay}}, caps: map[spec.Period]int64{spec.PeriodDay: 7000}},
		"default period day": {limits: []spec.Limit{{Tokens: 9000}}, caps: map[spec.Period]int64{spec.PeriodDay: 9000}},
		"monthly":            {limits: []spec.Limit{{Tokens: 9000, Per: spec.PeriodMonth}}, caps: map[spec.Period]int64{spec.PeriodMonth: 9000}},
		"every window": {limits: []spec.Limit{{Tokens: 1, Per: spec.PeriodHour}, {Tokens: 2, Per: spec.PeriodDay}, {Tokens: 3, Per: spec.PeriodWeek}, {Tokens: 4294967295, Per: spec.PeriodMonth}},
			caps: map[spec.Period]int64{spec.PeriodHour: 1, spec.PeriodDay: 2, spec.PeriodWeek: 3, spec.PeriodMonth: 4294967295}},
		"money":         {limits: []spec.Limit{{Cost: "5", Per: spec.PeriodDay}}, want: "limits[0]: a money limit"},
		"past uint32":   {limits: []spec.Limit{{Tokens: 6000000000, Per: spec.PeriodMonth}}, want: "limits[0]: token cap 6000000000 per month is not within 1..4294967295"},
		"second window": {limits: []spec.Limit{{Tokens: 1}, {Tokens: 2, Per: spec.PeriodMonth}, {Tokens: 3, Per: spec.PeriodMonth}}, want: "limits[2]: a second token cap per month"},
		"no cap":        {want: "no token cap"},
	} {
		t.Run(name, func(t *testing.T) {
			b := spec.Budget{TokensPerDay: tc.tokensPerDay, Limits: tc.limits}
			got, err := agentgatewayCaps("spec.budgets[b]", b.AllLimits())
			if tc.want == "" {
				if err != nil || !maps.Equal(got, tc.caps) {
					t.Fatalf("caps %v, %v; want %v", got, err, tc.caps)
				}
				return
			}
			var ue *UnsupportedError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "spec.budgets[b]") {
				t.Fatalf("error %v; want an UnsupportedError naming the budget and containing %q", err, tc.want)
			}
		})
	}
}

// The backend TLS policy: what agentgateway needs to reach the rate limit
// Service over TLS, per spec.rateLimitService.tls mode; sni names the
// Service, since agentgateway otherwise verifies the endpoint's address.
func TestRateLimitTLSPolicy(t *testing.T) {
	cases := []struct {
		name, tls string
		want      *agentgateway.BackendTLS // nil: no policy
	}{
		{"mutual default", "", &agentgateway.BackendTLS{
			MtlsCertificateRef: []agentgateway.LocalSecretRef{{Name: "rls-agentgateway-client"}},
			CACertificateRefs:  []agentgateway.LocalCARef{{Name: "rls-agentgateway-client", Kind: "Secret"}},
			SNI:                "rls.budgets.svc.cluster.local",
		}},
		{"mutual named", "{clientCertificateSecret: agw-client, caCertificate: {kind: ConfigMap, name: rls-ca}}", &agentgateway.BackendTLS{
			MtlsCertificateRef: []agentgateway.LocalSecretRef{{Name: "agw-client"}},
			CACertificateRefs:  []agentgateway.LocalCARef{{Name: "rls-ca", Kind: "ConfigMap"}},
			SNI:                "rls.budgets.svc.cluster.local",
		}},
		{"server", "{mode: server, caCertificate: {name: rls-ca}}", &agentgateway.BackendTLS{
			CACertificateRefs: []agentgateway.LocalCARef{{Name: "rls-ca", Kind: "Secret"}},
			SNI:               "rls.budgets.svc.cluster.local",
		}},
		{"disabled", "{mode: disabled}", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data, err := os.ReadFile("testdata/mixed_gateways.yaml")
			if err != nil {
				t.Fatal(err)
			}
			src := string(data) + "  rateLimitService: {namespace: budgets, name: rls, port: 9091"
			if c.tls != "" {
				src += ", tls: " + c.tls
			}
			bs, err := spec.Load([]byte(src+"}\n"), "mixed.yaml")
			if err != nil {
				t.Fatal(err)
			}
			res, err := Render(bs)
			if err != nil {
				t.Fatal(err)
			}
			var got *agentgateway.Policy
			for _, o := range res.Objects {
				if p, ok := agentgateway.Model(o.Object).(*agentgateway.Policy); ok && p.Spec.Backend != nil {
					validateAgentgateway(t, o)
					got = p
				}
			}
			if c.want == nil {
				if got != nil {
					t.Fatalf("TLS disabled, yet rendered %+v", got.Spec)
				}
				return
			}
			if got == nil {
				t.Fatal("no backend TLS policy rendered")
			}
			if got.Metadata.Namespace != "budgets" || got.Metadata.Name != "ai-budgets-ratelimit-tls" ||
				!slices.Equal(got.Spec.TargetRefs, []agentgateway.TargetRef{{Group: "", Kind: "Service", Name: "rls"}}) {
				t.Errorf("policy %s/%s targets %+v, want budgets/ai-budgets-ratelimit-tls on Service rls", got.Metadata.Namespace, got.Metadata.Name, got.Spec.TargetRefs)
			}
			if !reflect.DeepEqual(got.Spec.Backend.TLS, c.want) {
				t.Errorf("backend.tls = %+v, want %+v", got.Spec.Backend.TLS, c.want)
			}
		})
	}
}
