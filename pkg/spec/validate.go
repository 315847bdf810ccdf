package spec

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// DateLayout is the layout of shadowSince and enforcedSince (UTC dates).
const DateLayout = "2006-01-02"

var (
	dnsLabelRE   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	subdomainRE  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	headerNameRE = regexp.MustCompile(`^[a-z0-9!#$%&'*+.^_|~` + "`" + `-]+$`)
)

// Validate checks a defaulted BudgetSet and returns a yamlpos.List naming every
// problem by file, line and field path, or nil.
func (s *BudgetSet) Validate() error {
	v := &validator{s: s}
	v.check()
	return v.errs.Err()
}

type validator struct {
	s    *BudgetSet
	errs yamlpos.List
}

func (v *validator) fail(path, format string, args ...any) {
	v.errs = append(v.errs, v.s.Errorf(path, format, args...))
}

func (v *validator) check() {
	s := v.s
	if s.APIVersion != APIVersion {
		v.fail("apiVersion", "must be %s, got %q", APIVersion, s.APIVersion)
	}
	if s.Kind != Kind {
		v.fail("kind", "must be %s, got %q", Kind, s.Kind)
	}
	v.dnsLabel("metadata.name", s.Metadata.Name)

	if len(s.Spec.Gateways) == 0 {
		v.fail("spec.gateways", "at least one target Gateway is required")
	}
	seenGW := map[string]int{}
	for i, g := range s.Spec.Gateways {
		p := fmt.Sprintf("spec.gateways[%d]", i)
		v.dnsLabel(p+".namespace", g.Namespace)
		v.subdomain(p+".name", g.Name, true)
		v.subdomain(p+".sectionName", g.SectionName, false)
		if g.BasePolicy != "" && filepath.IsAbs(g.BasePolicy) {
			v.fail(p+".basePolicy", "must be a path relative to the spec file, got %q", g.BasePolicy)
		}
		if gc := g.GatewayConfig; gc != nil {
			v.subdomain(p+".gatewayConfig.name", gc.Name, true)
			if !slices.Contains(gatewayConfigTypes, gc.Type) {
				v.fail(p+".gatewayConfig.type", "must be one of %s, got %q", strings.Join(gatewayConfigTypes, ", "), gc.Type)
			}
			if ns := s.Spec.TokenSource.Namespace; ns != DefaultTokenMetadataNamespace {
				v.fail(p+".gatewayConfig", "Envoy AI Gateway writes its costs into metadata namespace %s, but spec.tokenSource.namespace is %q", DefaultTokenMetadataNamespace, ns)
			}
		}
		key := g.Namespace + "/" + g.Name
		if first, dup := seenGW[key]; dup {
			v.fail(p, "Gateway %s is already listed at spec.gateways[%d]: Envoy Gateway accepts one Gateway-level BackendTrafficPolicy per Gateway, so list it once", key, first)
		} else {
			seenGW[key] = i
		}
	}

	ts := s.Spec.TokenSource
	if strings.ContainsAny(ts.Namespace, ":%") {
		v.fail("spec.tokenSource.namespace", "must not contain ':' or '%%'")
	}
	if strings.ContainsAny(ts.Key, ":%") {
		v.fail("spec.tokenSource.key", "must not contain ':' or '%%'")
	}

	for _, h := range sortedKeys(s.Spec.Identities) {
		p := "spec.identities." + h
		if !headerNameRE.MatchString(h) {
			v.fail(p, "must be a lowercase HTTP header name")
		}
		id := s.Spec.Identities[h]
		n := 0
		if id.JWTClaim != "" {
			n++
		}
		if id.APIKeyClientID {
			n++
		}
		if id.ExtAuth {
			n++
		}
		if n != 1 {
			v.fail(p, "must set exactly one of jwtClaim, apiKeyClientID: true, extAuth: true (the verified credential that sets the header)")
		}
	}

	names := map[string]int{}
	for i := range s.Spec.Budgets {
		v.budget(i, names)
	}
	if f := s.Spec.Frontier; f != nil {
		v.frontier(f)
	}
	v.placement()
	v.costs()
}

func (v *validator) budget(i int, names map[string]int) {
	b := &v.s.Spec.Budgets[i]
	p := fmt.Sprintf("spec.budgets[%d]", i)
	switch {
	case b.Name == "":
		v.fail(p+".name", "is required")
	case b.Name == FrontierName:
		v.fail(p+".name", "%q is reserved for spec.frontier", FrontierName)
	case !dnsLabelRE.MatchString(b.Name) || len(b.Name) > 63:
		v.fail(p+".name", "must be a DNS-1123 label (lowercase letters, digits, '-'), got %q", b.Name)
	default:
		if first, dup := names[b.Name]; dup {
			v.fail(p+".name", "duplicate budget name %q (first at spec.budgets[%d])", b.Name, first)
		} else {
			names[b.Name] = i
		}
	}
	switch {
	case b.PerPrincipal != "" && b.Group != nil:
		v.fail(p, "set either perPrincipal or group, not both")
	case b.PerPrincipal == "" && b.Group == nil:
		v.fail(p, "set one of perPrincipal (one bucket per header value) or group (one shared bucket)")
	case b.Group != nil:
		v.identityHeader(p+".group.header", b.Group.Header)
		if b.Group.Equals == "" {
			v.fail(p+".group.equals", "is required")
		} else if len(b.Group.Equals) > 1024 {
			v.fail(p+".group.equals", "must be at most 1024 characters (Envoy Gateway's header value limit)")
		}
		if len(b.Overrides) > 0 {
			v.fail(p+".overrides", "a group budget is one shared bucket: overrides apply to perPrincipal budgets only")
		}
	default:
		v.identityHeader(p+".perPrincipal", b.PerPrincipal)
	}
	v.limits(p, b.TokensPerDay, b.Limits)
	v.rollout(p, &b.Rollout)
	v.reservation(p, b.Reservation)
	if b.Group != nil {
		return
	}
	seen := map[string]int{}
	for j, o := range b.Overrides {
		op := fmt.Sprintf("%s.overrides[%d]", p, j)
		if o.Principal == "" {
			v.fail(op+".principal", "is required")
		} else if first, dup := seen[o.Principal]; dup {
			v.fail(op+".principal", "duplicate override for %q (first at overrides[%d])", o.Principal, first)
		} else {
			seen[o.Principal] = j
		}
		v.limits(op, o.TokensPerDay, o.Limits)
	}
}

func (v *validator) frontier(f *Frontier) {
	const p = "spec.frontier"
	if len(f.Models) == 0 {
		v.fail(p+".models", "at least one model regular expression is required")
	}
	for i, m := range f.Models {
		mp := fmt.Sprintf("%s.models[%d]", p, i)
		if m == "" {
			v.fail(mp, "must not be empty")
			continue
		}
		if _, err := regexp.Compile(m); err != nil {
			v.fail(mp, "invalid regular expression: %v", err)
		}
	}
	if !headerNameRE.MatchString(f.Header) {
		v.fail(p+".header", "must be a lowercase HTTP header name, got %q", f.Header)
	}
	v.limits(p, f.TokensPerDay, f.Limits)
	v.rollout(p, &f.Rollout)
	v.reservation(p, f.Reservation)
}

func (v *validator) identityHeader(path, h string) {
	if h == "" {
		v.fail(path, "is required")
		return
	}
	if _, ok := v.s.Spec.Identities[h]; !ok {
		v.fail(path, "header %q is not declared in spec.identities: budgets may only key on headers set from a verified credential", h)
	}
}

func (v *validator) cap(path string, n int64) {
	switch {
	case n <= 0:
		v.fail(path, "must be > 0 (use frontier.killSwitch to stop traffic)")
	case n > MaxTokensPerDay:
		v.fail(path, "must be at most %d (Envoy Gateway's limit.requests is a uint32)", int64(MaxTokensPerDay))
	}
}

func (v *validator) rollout(p string, r *Rollout) {
	switch r.Mode {
	case ModeShadow, ModeEnforce:
	default:
		v.fail(p+".mode", "unknown mode %q: must be shadow or enforce", r.Mode)
	}
	v.date(p+".shadowSince", r.ShadowSince)
	v.date(p+".enforcedSince", r.EnforcedSince)
}

func (v *validator) date(path, d string) {
	if d == "" {
		return
	}
	if _, err := ParseDate(d); err != nil {
		v.fail(path, "must be a date YYYY-MM-DD, got %q", d)
	}
}

// subdomain checks a Kubernetes object name or Gateway API section name
// (DNS-1123 subdomain), so render never emits a targetRef EG rejects.
func (v *validator) subdomain(path, s string, required bool) {
	switch {
	case s == "" && required:
		v.fail(path, "is required")
	case s == "":
	case len(s) > 253 || !subdomainRE.MatchString(s):
		v.fail(path, "must be a DNS-1123 subdomain (lowercase letters, digits, '-', '.', at most 253), got %q", s)
	}
}

func (v *validator) dnsLabel(path, s string) {
	switch {
	case s == "":
		v.fail(path, "is required")
	case len(s) > 63 || !dnsLabelRE.MatchString(s):
		v.fail(path, "must be a DNS-1123 label (lowercase letters, digits, '-', at most 63), got %q", s)
	}
}

// ParseDate parses a YYYY-MM-DD date as midnight UTC.
func ParseDate(s string) (time.Time, error) {
	return time.Parse(DateLayout, s)
}

// FormatDate formats t's UTC date as YYYY-MM-DD.
func FormatDate(t time.Time) string {
	return t.UTC().Format(DateLayout)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// gatewayConfigTypes are the Envoy AI Gateway LLMRequestCost types a
// rendered GatewayConfig may use (CEL needs an expression the spec does not hold).
var gatewayConfigTypes = []string{"TotalToken", "InputToken", "OutputToken", "CachedInputToken", "CacheCreationInputToken", "ReasoningToken"}
