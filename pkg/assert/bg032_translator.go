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
	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/manifest"
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
	rl := manifest.Get(o.Node, "spec", "rateLimit")
	if rl == nil {
		return
	}
	what := "its routes answer 500 (EG sets a direct response when a policy does not translate) instead of being limited"
	if pol := policyOf(p.Index, o); pol != nil && pol.Budget {
		what = "every route it applies to answers 500 (EG sets a direct response when a policy does not translate), and none of its budgets runs"
	}
	for _, scope := range []string{"global", "local"} {
		for i, rule := range manifest.Items(manifest.Get(rl, scope, "rules")) {
			if scope == "local" && manifest.Get(rule, "clientSelectors") == nil {
				continue // the default limit; buildLocalRateLimit checks the rest
			}
			base := fmt.Sprintf("spec.rateLimit.%s.rules[%d]", scope, i)
			for _, fe := range rateLimitRuleErrors(rule) {
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
// internal/gatewayapi/backendtrafficpolicy.go) over the rule's YAML (read
// without decoding: the gate stays fast on large policies), with paths
// relative to the rule. Absent types are the CRD's defaults (Exact,
// PathPrefix).
func rateLimitRuleErrors(rule *yaml.Node) []FieldError {
	var out []FieldError
	add := func(path, format string, args ...any) {
		out = append(out, FieldError{Path: path, Message: fmt.Sprintf(format, args...)})
	}
	for s, sel := range manifest.Items(manifest.Get(rule, "clientSelectors")) {
		sp := fmt.Sprintf(".clientSelectors[%d]", s)
		if len(manifest.Items(manifest.Get(sel, "headers"))) == 0 && len(manifest.Items(manifest.Get(sel, "methods"))) == 0 &&
			manifest.Get(sel, "path") == nil && manifest.Get(sel, "sourceCIDR") == nil && len(manifest.Items(manifest.Get(sel, "queryParams"))) == 0 {
			add(sp, "a client selector matches nothing (at least one of headers, methods, path, sourceCIDR or queryParams)")
		}
		for h, hm := range manifest.Items(manifest.Get(sel, "headers")) {
			if msg := matchError(hm, false); msg != "" {
				add(fmt.Sprintf("%s.headers[%d]", sp, h), "header match %s: %s", manifest.Str(manifest.Get(hm, "name")), msg)
			}
		}
		if pm := manifest.Get(sel, "path"); manifest.Str(manifest.Get(pm, "type")) == "RegularExpression" {
			if v := manifest.Str(manifest.Get(pm, "value")); !compiles(v) {
				add(sp+".path", "path regular expression %q does not compile (RE2 syntax)", v)
			}
		}
		if c := manifest.Get(sel, "sourceCIDR", "value"); c != nil {
			if _, _, err := net.ParseCIDR(manifest.Str(c)); err != nil {
				add(sp+".sourceCIDR.value", "source CIDR: %v", err)
			}
		}
		for q, qm := range manifest.Items(manifest.Get(sel, "queryParams")) {
			if msg := matchError(qm, true); msg != "" {
				add(fmt.Sprintf("%s.queryParams[%d]", sp, q), "query parameter match %q: %s", manifest.Str(manifest.Get(qm, "name")), msg)
			}
		}
	}
	return out
}

// matchError checks a header (or query parameter) match as buildRateLimitRule
// does: Exact and RegularExpression need a value (a query parameter's must
// not be empty), the expression must compile, Distinct takes neither a value
// nor invert.
func matchError(m *yaml.Node, query bool) string {
	typ := manifest.Str(manifest.Get(m, "type"))
	if typ == "" {
		typ = "Exact"
	}
	v := manifest.Get(m, "value")
	invert, _ := manifest.Bool(manifest.Get(m, "invert"))
	switch {
	case query && manifest.Str(manifest.Get(m, "name")) == "":
		return "name is required"
	case typ == "Distinct" && (v != nil || invert):
		return "a Distinct match takes no value and cannot be inverted (one bucket per value)"
	case typ == "Distinct":
		return ""
	case typ != "Exact" && typ != "RegularExpression":
		return fmt.Sprintf("unknown type %s", typ)
	case v == nil || query && manifest.Str(v) == "":
		return fmt.Sprintf("type %s needs a value", typ)
	case typ == "RegularExpression" && !compiles(manifest.Str(v)):
		_, err := regexp.Compile(manifest.Str(v))
		return fmt.Sprintf("regular expression %q does not compile (RE2 syntax): %v", manifest.Str(v), err)
	}
	return ""
}

func compiles(expr string) bool {
	_, err := regexp.Compile(expr)
	return err == nil
}

// checkSecurityTranslates mirrors validateAPIKeyAuth and validateJWTProvider
// (EG v1.9.1, internal/gatewayapi/securitypolicy.go).
func checkSecurityTranslates(p *Pass, o *manifest.Object) {
	spec, _, err := p.Index.effectiveSecurity(&attachment{Policy: o}, nil) // decoded once for every rule
	if err != nil {
		return
	}
	sp := egv1a1.SecurityPolicy{Spec: *spec}
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
