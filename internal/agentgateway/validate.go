package agentgateway

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
)

// FieldError is one broken schema rule: Path is the field path in the object
// (spec.traffic.rateLimit.global.descriptors[0].entries[1].expression).
type FieldError struct {
	Path string
	Msg  string
}

func (e FieldError) Error() string { return e.Path + ": " + e.Msg }

const gatewayAPIGroup = "gateway.networking.k8s.io"

var (
	urlRE     = regexp.MustCompile(`^https?://[^/?#]+$`)
	trafficOK = map[string]string{ // kind -> group a traffic policy may target
		"Gateway": gatewayAPIGroup, "HTTPRoute": gatewayAPIGroup, "GRPCRoute": gatewayAPIGroup,
		"ListenerSet": gatewayAPIGroup, "InferencePool": "inference.networking.k8s.io",
	}
	backendOK = map[string]string{ // kind -> group a backend policy may target
		"Gateway": gatewayAPIGroup, "HTTPRoute": gatewayAPIGroup, "GRPCRoute": gatewayAPIGroup,
		"ListenerSet": gatewayAPIGroup, "InferencePool": "inference.networking.k8s.io",
		"Service": "", "AgentgatewayBackend": Group,
	}
)

// Validate applies the CRD's schema rules to the fields budgetgen models and
// checks that every CEL expression parses (the controller rejects one that
// does not). It returns every problem, in field order; nil means valid.
func Validate(p *Policy) []FieldError {
	var errs []FieldError
	fail := func(path, format string, args ...any) {
		errs = append(errs, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
	}
	if p.APIVersion != APIVersion {
		fail("apiVersion", "must be %s, got %q", APIVersion, p.APIVersion)
	}
	if p.Kind != KindPolicy {
		fail("kind", "must be %s, got %q", KindPolicy, p.Kind)
	}
	if p.Metadata.Name == "" || p.Metadata.Namespace == "" {
		fail("metadata", "name and namespace are required")
	}
	refs, sels := p.Spec.TargetRefs, p.Spec.TargetSelectors
	switch {
	case (len(refs) == 0) == (len(sels) == 0):
		fail("spec.targetRefs", "exactly one of targetRefs and targetSelectors is required (budgetgen renders targetRefs)")
	case len(refs) > MaxTargetRefs:
		fail("spec.targetRefs", "at most %d items, got %d", MaxTargetRefs, len(refs))
	case len(sels) > MaxTargetRefs:
		fail("spec.targetSelectors", "at most %d items, got %d", MaxTargetRefs, len(sels))
	}
	backendOnly := p.Spec.Traffic == nil && p.Spec.Backend != nil
	target := func(path, group, kind, firstKind string) {
		if backendOnly {
			if g, ok := backendOK[kind]; !ok || g != group {
				fail(path, "targetRefs may only reference Gateway, HTTPRoute, GRPCRoute, ListenerSet, Service, AgentgatewayBackend, or InferencePool resources, got %s/%s", group, kind)
			}
		} else if g, ok := trafficOK[kind]; !ok || g != group {
			fail(path, "a traffic policy can only target a Gateway, ListenerSet, GRPCRoute, HTTPRoute (group %s) or InferencePool, got %s/%s", gatewayAPIGroup, group, kind)
		}
		if kind != firstKind {
			fail(path, "only one kind of targetRef can be set on one policy")
		}
	}
	for i, r := range refs {
		path := fmt.Sprintf("spec.targetRefs[%d]", i)
		if r.Kind == "" || r.Name == "" {
			fail(path, "group, kind and name are required")
		}
		target(path, r.Group, r.Kind, refs[0].Kind)
	}
	for i, s := range sels {
		path := fmt.Sprintf("spec.targetSelectors[%d]", i)
		if s.Kind == "" || s.MatchLabels == nil {
			fail(path, "group, kind and matchLabels are required")
		}
		target(path, s.Group, s.Kind, sels[0].Kind)
	}
	if backendOnly {
		return append(errs, validateBackend(p.Spec.Backend)...)
	}
	if p.Spec.Backend != nil {
		fail("spec.backend", "budgetgen renders backend settings in a policy of their own, not beside traffic")
	}
	t := p.Spec.Traffic
	if t == nil || t.RateLimit == nil || t.RateLimit.Global == nil {
		fail("spec.traffic.rateLimit.global", "is required (budgetgen renders a global rate limit)")
		return errs
	}
	g := t.RateLimit.Global
	gp := "spec.traffic.rateLimit.global"
	if (g.BackendRef == nil) == (g.URL == "") {
		fail(gp, "exactly one of the fields in [backendRef url] must be set")
	}
	if g.URL != "" && (len(g.URL) > 1024 || !urlRE.MatchString(g.URL)) {
		fail(gp+".url", "must match ^https?://[^/?#]+$ (no path), at most 1024 characters")
	}
	if b := g.BackendRef; b != nil {
		if b.Name == "" || len(b.Name) > 253 {
			fail(gp+".backendRef.name", "is required, 1..253 characters")
		}
		group := ""
		if b.Group != nil {
			group = *b.Group
		}
		kind := b.Kind
		if kind == "" {
			kind = "Service"
		}
		if b.Port != nil && (*b.Port < 1 || *b.Port > 65535) {
			fail(gp+".backendRef.port", "must be 1..65535, got %d", *b.Port)
		}
		if group == "" && kind == "Service" && b.Port == nil {
			fail(gp+".backendRef.port", "Must have port for Service reference")
		}
	}
	if g.FailureMode != "" && g.FailureMode != FailOpen && g.FailureMode != FailClosed {
		fail(gp+".failureMode", "must be %s or %s, got %q", FailClosed, FailOpen, g.FailureMode)
	}
	if n := len(g.Domain); n < 1 || n > MaxDomainLength {
		fail(gp+".domain", "is required, 1..%d characters, got %d", MaxDomainLength, n)
	}
	if n := len(g.Descriptors); n < 1 || n > MaxDescriptors {
		fail(gp+".descriptors", "must have 1..%d items, got %d", MaxDescriptors, n)
	}
	for i, d := range g.Descriptors {
		dp := fmt.Sprintf("%s.descriptors[%d]", gp, i)
		if n := len(d.Entries); n < 1 || n > MaxEntries {
			fail(dp+".entries", "must have 1..%d items, got %d", MaxEntries, n)
		}
		for j, e := range d.Entries {
			ep := fmt.Sprintf("%s.entries[%d]", dp, j)
			if n := len(e.Name); n < 1 || n > MaxEntryNameLength {
				fail(ep+".name", "is required, 1..%d characters, got %d", MaxEntryNameLength, n)
			}
			checkCEL(ep+".expression", e.Expression, true, fail)
		}
		if d.Unit != "" && d.Unit != UnitRequests && d.Unit != UnitTokens {
			fail(dp+".unit", "must be %s or %s, got %q", UnitRequests, UnitTokens, d.Unit)
		}
		checkCEL(dp+".cost", d.Cost, false, fail)
		checkCEL(dp+".limitOverride", d.LimitOverride, false, fail)
	}
	return errs
}

func checkCEL(path, expr string, required bool, fail func(string, string, ...any)) {
	if expr == "" {
		if required {
			fail(path, "is required")
		}
		return
	}
	if len(expr) > MaxExpressionLength {
		fail(path, "at most %d characters, got %d", MaxExpressionLength, len(expr))
		return
	}
	if _, err := Variables(expr); err != nil {
		fail(path, "%v", err)
	}
}

// Variables parses a CEL expression and returns the top-level variables it
// reads (jwt, request, apiKey, ...), sorted. The gate uses it to tell a
// principal read from a verified JWT from one read from a request header.
func Variables(expr string) ([]string, error) {
	env, err := cel.NewEnv()
	if err != nil {
		return nil, fmt.Errorf("cel environment: %w", err)
	}
	ast, iss := env.Parse(expr)
	if iss != nil && iss.Err() != nil {
		msg, _, _ := strings.Cut(iss.Err().Error(), "\n")
		return nil, fmt.Errorf("not a valid CEL expression: %s", msg)
	}
	seen := map[string]bool{}
	celast.PreOrderVisit(celast.NavigateAST(ast.NativeRep()), celast.NewExprVisitor(func(e celast.Expr) {
		if e.Kind() == celast.IdentKind {
			seen[e.AsIdent()] = true
		}
	}))
	out := make([]string, 0, len(seen))
	for v := range seen {
		out = append(out, v)
	}
	sort.Strings(out)
	return slices.Clip(out), nil
}
