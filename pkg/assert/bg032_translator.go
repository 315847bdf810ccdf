package assert

import (
	"encoding/json"
	"fmt"
	"net"
	"net/mail"
	"net/url"
	"regexp"
	"strings"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"github.com/envoyproxy/gateway/api/v1alpha1/validation"

	"github.com/budgetgen/budgetgen/internal/manifest"
)

// ruleTranslatorValid: objects the CRD schema accepts and Envoy Gateway's
// translator refuses. A BackendTrafficPolicy whose rate limit rules do not
// translate (internal/gatewayapi/backendtrafficpolicy.go buildRateLimitRule:
// a regular expression RE2 - Go's regexp, which EG's regex.Validate compiles
// with - cannot compile, a header match without a value, Distinct with a
// value or inverted, a selector with nothing to match, an unparsable CIDR,
// a query parameter match without name or value) makes every route it
// applies to answer 500 (a direct response) - a budget policy takes its whole
// Gateway down, or, rolled back in a hurry, leaves it unlimited. A
// SecurityPolicy whose JWT providers or API key sources EG refuses
// (securitypolicy.go validateJWTProvider, validateAPIKeyAuth) does the same to
// its routes. An EnvoyProxy EG refuses (api/v1alpha1/validation
// ValidateEnvoyProxy, called by the translator's validateEnvoyProxy; EG's own
// package, imported here) keeps its Gateways from being accepted.
var ruleTranslatorValid = &Rule{
	ID:       "BG032",
	Name:     "translator-valid",
	Doc:      "what Envoy Gateway's translator refuses beyond the CRD schema: rate limit matches (RE2 regular expressions, values, Distinct, CIDRs), JWT providers, API key sources, EnvoyProxy (EG's validation package)",
	Severity: Error,
	Check: func(p *Pass) error {
		for _, pol := range p.Index.Policies {
			checkRateLimitTranslates(p, pol.Obj)
		}
		for _, sp := range p.Index.SecurityPolicies {
			checkSecurityTranslates(p, sp)
		}
		for _, o := range p.Index.Objects {
			if o.Group() == GroupEG && o.Kind == "EnvoyProxy" {
				checkEnvoyProxyValid(p, o)
			}
		}
		return nil
	},
}

// decodeTyped decodes o into a typed API object; false (and nothing
// reported: BG007 reports what the schema refuses) when it does not decode.
func decodeTyped(o *manifest.Object, into any) bool {
	data, err := objectJSON(o)
	return err == nil && json.Unmarshal(data, into) == nil
}

func checkRateLimitTranslates(p *Pass, o *manifest.Object) {
	var btp egv1a1.BackendTrafficPolicy
	if !decodeTyped(o, &btp) || btp.Spec.RateLimit == nil {
		return
	}
	what := "its routes answer 500 (EG sets a direct response when a policy does not translate) instead of being limited"
	if pol := policyOf(p.Index, o); pol != nil && pol.Budget {
		what = "every route it applies to answers 500 (EG sets a direct response when a policy does not translate), and none of its budgets runs"
	}
	if g := btp.Spec.RateLimit.Global; g != nil {
		for i := range g.Rules {
			base := fmt.Sprintf("spec.rateLimit.global.rules[%d]", i)
			for _, fe := range rateLimitRuleErrors(&g.Rules[i]) {
				p.Report(o, NodeAt(o.Node, base+fe.Path), base+fe.Path, "%s: Envoy Gateway's translator refuses it (backendtrafficpolicy.go buildRateLimitRule): %s", fe.Message, what)
			}
		}
	}
	if l := btp.Spec.RateLimit.Local; l != nil {
		for i := range l.Rules {
			if len(l.Rules[i].ClientSelectors) == 0 {
				continue // the default limit; buildLocalRateLimit checks the rest
			}
			base := fmt.Sprintf("spec.rateLimit.local.rules[%d]", i)
			for _, fe := range rateLimitRuleErrors(&l.Rules[i]) {
				p.Report(o, NodeAt(o.Node, base+fe.Path), base+fe.Path, "%s: Envoy Gateway's translator refuses it (backendtrafficpolicy.go buildRateLimitRule): %s", fe.Message, what)
			}
		}
	}
}

func policyOf(ix *Index, o *manifest.Object) *Policy {
	for _, p := range ix.Policies {
		if p.Obj == o {
			return p
		}
	}
	return nil
}

// rateLimitRuleErrors mirrors the checks of buildRateLimitRule (EG v1.9.1,
// internal/gatewayapi/backendtrafficpolicy.go), with paths relative to the rule.
func rateLimitRuleErrors(rule *egv1a1.RateLimitRule) []FieldError {
	var out []FieldError
	add := func(path, format string, args ...any) {
		out = append(out, FieldError{Path: path, Message: fmt.Sprintf(format, args...)})
	}
	for s, sel := range rule.ClientSelectors {
		sp := fmt.Sprintf(".clientSelectors[%d]", s)
		if len(sel.Headers) == 0 && len(sel.Methods) == 0 && sel.Path == nil && sel.SourceCIDR == nil && len(sel.QueryParams) == 0 {
			add(sp, "a client selector matches nothing (at least one of headers, methods, path, sourceCIDR or queryParams)")
		}
		for h, hm := range sel.Headers {
			if msg := headerMatchError(hm); msg != "" {
				add(fmt.Sprintf("%s.headers[%d]", sp, h), "header match %s: %s", hm.Name, msg)
			}
		}
		if sel.Path != nil {
			if msg := pathMatchError(sel.Path); msg != "" {
				add(sp+".path", "%s", msg)
			}
		}
		if sel.SourceCIDR != nil {
			if _, _, err := net.ParseCIDR(sel.SourceCIDR.Value); err != nil {
				add(sp+".sourceCIDR.value", "source CIDR %q: %v", sel.SourceCIDR.Value, err)
			}
		}
		for q, qp := range sel.QueryParams {
			if msg := queryMatchError(qp); msg != "" {
				add(fmt.Sprintf("%s.queryParams[%d]", sp, q), "query parameter match %q: %s", qp.Name, msg)
			}
		}
	}
	return out
}

func headerMatchError(hm egv1a1.HeaderMatch) string {
	typ := egv1a1.HeaderMatchExact
	if hm.Type != nil {
		typ = *hm.Type
	}
	switch {
	case typ == egv1a1.HeaderMatchExact && hm.Value != nil:
	case typ == egv1a1.HeaderMatchRegularExpression && hm.Value != nil:
		if _, err := regexp.Compile(*hm.Value); err != nil {
			return fmt.Sprintf("regular expression %q does not compile (RE2 syntax): %v", *hm.Value, err)
		}
	case typ == egv1a1.HeaderMatchDistinct && hm.Value == nil:
		if hm.Invert != nil && *hm.Invert {
			return "invert is not applicable to a Distinct match"
		}
	case typ == egv1a1.HeaderMatchDistinct:
		return "a Distinct match takes no value (one bucket per value of the header)"
	default:
		return fmt.Sprintf("type %s needs a value", typ)
	}
	return ""
}

func pathMatchError(pm *egv1a1.PathMatch) string {
	if pm.Type != nil && *pm.Type == "RegularExpression" {
		if _, err := regexp.Compile(pm.Value); err != nil {
			return fmt.Sprintf("path regular expression %q does not compile (RE2 syntax): %v", pm.Value, err)
		}
	}
	return ""
}

func queryMatchError(qp egv1a1.QueryParamMatch) string {
	typ := egv1a1.QueryParamMatchExact
	if qp.Type != nil {
		typ = *qp.Type
	}
	empty := qp.Value == nil || *qp.Value == ""
	switch {
	case qp.Name == "":
		return "name is required"
	case typ == egv1a1.QueryParamMatchExact && empty, typ == egv1a1.QueryParamMatchRegularExpression && empty:
		return fmt.Sprintf("type %s needs a value", typ)
	case typ == egv1a1.QueryParamMatchRegularExpression:
		if _, err := regexp.Compile(*qp.Value); err != nil {
			return fmt.Sprintf("regular expression %q does not compile (RE2 syntax): %v", *qp.Value, err)
		}
	case typ == egv1a1.QueryParamMatchDistinct && (qp.Invert != nil && *qp.Invert || qp.Value != nil):
		return "a Distinct match takes no value and cannot be inverted"
	}
	return ""
}

// checkSecurityTranslates mirrors validateAPIKeyAuth and validateJWTProvider
// (EG v1.9.1, internal/gatewayapi/securitypolicy.go).
func checkSecurityTranslates(p *Pass, o *manifest.Object) {
	var sp egv1a1.SecurityPolicy
	if !decodeTyped(o, &sp) {
		return
	}
	const what = "Envoy Gateway's translator refuses it (securitypolicy.go %s): every route the policy applies to answers 500 and no identity header is set"
	if a := sp.Spec.APIKeyAuth; a != nil {
		for i, src := range a.ExtractFrom {
			n := 0
			for _, l := range []int{len(src.Headers), len(src.Params), len(src.Cookies)} {
				if l > 0 {
					n++
				}
			}
			if n > 1 {
				path := fmt.Sprintf("spec.apiKeyAuth.extractFrom[%d]", i)
				p.Report(o, NodeAt(o.Node, path), path, "only one of headers, params or cookies may be set per source; "+what, "validateAPIKeyAuth")
			}
		}
	}
	if sp.Spec.JWT == nil {
		return
	}
	for i, pr := range sp.Spec.JWT.Providers {
		path := fmt.Sprintf("spec.jwt.providers[%d]", i)
		for _, msg := range jwtProviderErrors(pr, sp.Spec.JWT.Providers[:i]) {
			p.Report(o, NodeAt(o.Node, path), path, "JWT provider %q: %s; "+what, pr.Name, msg, "validateJWTProvider")
		}
	}
}

func jwtProviderErrors(pr egv1a1.JWTProvider, earlier []egv1a1.JWTProvider) []string {
	var out []string
	switch {
	case strings.Contains(pr.Issuer, ":"):
		if _, err := url.ParseRequestURI(pr.Issuer); err != nil {
			out = append(out, "an issuer containing ':' must be a valid URI")
		}
	case strings.Contains(pr.Issuer, "@"):
		if _, err := mail.ParseAddress(pr.Issuer); err != nil {
			out = append(out, "an issuer containing '@' must be an email address")
		}
	}
	if (pr.RemoteJWKS == nil) == (pr.LocalJWKS == nil) {
		out = append(out, "exactly one of remoteJWKS and localJWKS is required")
	}
	if pr.RemoteJWKS != nil {
		if _, err := url.ParseRequestURI(pr.RemoteJWKS.URI); err != nil {
			out = append(out, fmt.Sprintf("remoteJWKS.uri %q is not a valid URI", pr.RemoteJWKS.URI))
		}
	}
	for _, e := range earlier {
		if e.Name == pr.Name {
			out = append(out, "provider names must be unique")
		}
	}
	for _, c := range pr.ClaimToHeaders {
		if c.Header == "" || c.Claim == "" {
			out = append(out, "every claimToHeaders entry needs a claim and a header")
		}
	}
	return out
}

func checkEnvoyProxyValid(p *Pass, o *manifest.Object) {
	var ep egv1a1.EnvoyProxy
	if !decodeTyped(o, &ep) {
		return
	}
	if err := validation.ValidateEnvoyProxy(&ep); err != nil {
		p.Report(o, manifest.Key(o.Node, "spec"), "spec", "Envoy Gateway refuses this EnvoyProxy (api/v1alpha1/validation ValidateEnvoyProxy, which its translator calls): %v; a Gateway using it is not accepted and serves nothing", err)
	}
}
