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
	var errs problems
	validateHead(p, &errs)
	backendOnly := p.Spec.Traffic == nil && p.Spec.Backend != nil
	validateTargets(p.Spec, backendOnly, &errs)
	if backendOnly {
		return append(errs, validateBackend(p.Spec.Backend)...)
	}
	if p.Spec.Backend != nil {
		errs.fail("spec.backend", "budgetgen renders backend settings in a policy of their own, not beside traffic")
	}
	t := p.Spec.Traffic
	if t == nil || t.RateLimit == nil || t.RateLimit.Global == nil {
		errs.fail("spec.traffic.rateLimit.global", "is required (budgetgen renders a global rate limit)")
		return errs
	}
	validateGlobal(t.RateLimit.Global, &errs)
	return errs
}

// problems collects the FieldErrors of one object, in field order.
type problems []FieldError

func (p *problems) fail(path, format string, args ...any) {
	*p = append(*p, FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// validateHead checks apiVersion, kind and metadata.
func validateHead(p *Policy, errs *problems) {
	if p.APIVersion != APIVersion {
		errs.fail("apiVersion", "must be %s, got %q", APIVersion, p.APIVersion)
	}
	if p.Kind != KindPolicy {
		errs.fail("kind", "must be %s, got %q", KindPolicy, p.Kind)
	}
	if p.Metadata.Name == "" || p.Metadata.Namespace == "" {
		errs.fail("metadata", "name and namespace are required")
	}
}

// validateTargets checks spec.targetRefs or spec.targetSelectors: exactly one
// list, kinds the policy's section may target (a backend-only policy may
// target more), one kind per policy.
func validateTargets(spec PolicySpec, backendOnly bool, errs *problems) {
	refs, sels := spec.TargetRefs, spec.TargetSelectors
	switch {
	case (len(refs) == 0) == (len(sels) == 0):
		errs.fail("spec.targetRefs", "exactly one of targetRefs and targetSelectors is required (budgetgen renders targetRefs)")
	case len(refs) > MaxTargetRefs:
		errs.fail("spec.targetRefs", "at most %d items, got %d", MaxTargetRefs, len(refs))
	case len(sels) > MaxTargetRefs:
		errs.fail("spec.targetSelectors", "at most %d items, got %d", MaxTargetRefs, len(sels))
	}
	target := func(path, group, kind, firstKind string) {
		if backendOnly {
			if g, ok := backendOK[kind]; !ok || g != group {
				errs.fail(path, "targetRefs may only reference Gateway, HTTPRoute, GRPCRoute, ListenerSet, Service, AgentgatewayBackend, or InferencePool resources, got %s/%s", group, kind)
			}
		} else if g, ok := trafficOK[kind]; !ok || g != group {
			errs.fail(path, "a traffic policy can only target a Gateway, ListenerSet, GRPCRoute, HTTPRoute (group %s) or InferencePool, got %s/%s", gatewayAPIGroup, group, kind)
		}
		if kind != firstKind {
			errs.fail(path, "only one kind of targetRef can be set on one policy")
		}
	}
	for i, r := range refs {
		path := fmt.Sprintf("spec.targetRefs[%d]", i)
		if r.Kind == "" || r.Name == "" {
			errs.fail(path, "group, kind and name are required")
		}
		target(path, r.Group, r.Kind, refs[0].Kind)
	}
	for i, s := range sels {
		path := fmt.Sprintf("spec.targetSelectors[%d]", i)
		if s.Kind == "" || s.MatchLabels == nil {
			errs.fail(path, "group, kind and matchLabels are required")
		}
		target(path, s.Group, s.Kind, sels[0].Kind)
	}
}

// validateGlobal checks spec.traffic.rateLimit.global: where the rate limit
// service is, the failure mode, the domain, then every descriptor.
func validateGlobal(g *GlobalRateLimit, errs *problems) {
	const gp = "spec.traffic.rateLimit.global"
	if (g.BackendRef == nil) == (g.URL == "") {
		errs.fail(gp, "exactly one of the fields in [backendRef url] must be set")
	}
	if g.URL != "" && (len(g.URL) > 1024 || !urlRE.MatchString(g.URL)) {
		errs.fail(gp+".url", "must match ^https?://[^/?#]+$ (no path), at most 1024 characters")
	}
	if b := g.BackendRef; b != nil {
		validateBackendRef(gp+".backendRef", b, errs)
	}
	if g.FailureMode != "" && g.FailureMode != FailOpen && g.FailureMode != FailClosed {
		errs.fail(gp+".failureMode", "must be %s or %s, got %q", FailClosed, FailOpen, g.FailureMode)
	}
	if n := len(g.Domain); n < 1 || n > MaxDomainLength {
		errs.fail(gp+".domain", "is required, 1..%d characters, got %d", MaxDomainLength, n)
	}
	if n := len(g.Descriptors); n < 1 || n > MaxDescriptors {
		errs.fail(gp+".descriptors", "must have 1..%d items, got %d", MaxDescriptors, n)
	}
	for i, d := range g.Descriptors {
		validateDescriptor(fmt.Sprintf("%s.descriptors[%d]", gp, i), d, errs)
	}
}

// validateBackendRef checks the rate limit service's reference: a Service
// (the default kind, core group) needs a port.
func validateBackendRef(path string, b *BackendRef, errs *problems) {
	if b.Name == "" || len(b.Name) > 253 {
		errs.fail(path+".name", "is required, 1..253 characters")
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
		errs.fail(path+".port", "must be 1..65535, got %d", *b.Port)
	}
	if group == "" && kind == "Service" && b.Port == nil {
		errs.fail(path+".port", "Must have port for Service reference")
	}
}

// validateDescriptor checks one descriptor: its entries (names, CEL), unit,
// cost and limit override.
func validateDescriptor(dp string, d Descriptor, errs *problems) {
	if n := len(d.Entries); n < 1 || n > MaxEntries {
		errs.fail(dp+".entries", "must have 1..%d items, got %d", MaxEntries, n)
	}
	for j, e := range d.Entries {
		ep := fmt.Sprintf("%s.entries[%d]", dp, j)
		if n := len(e.Name); n < 1 || n > MaxEntryNameLength {
			errs.fail(ep+".name", "is required, 1..%d characters, got %d", MaxEntryNameLength, n)
		}
		checkCEL(ep+".expression", e.Expression, true, errs.fail)
	}
	if d.Unit != "" && d.Unit != UnitRequests && d.Unit != UnitTokens {
		errs.fail(dp+".unit", "must be %s or %s, got %q", UnitRequests, UnitTokens, d.Unit)
	}
	checkCEL(dp+".cost", d.Cost, false, errs.fail)
	checkCEL(dp+".limitOverride", d.LimitOverride, false, errs.fail)
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
	return collect(expr, func(e celast.Expr, add func(string)) {
		if e.Kind() == celast.IdentKind {
			add(e.AsIdent())
		}
	})
}

// Claims returns the JWT claims a CEL expression reads by name (jwt.c,
// jwt["c"], jwt[?"c"]), sorted.
func Claims(expr string) ([]string, error) {
	return collect(expr, func(e celast.Expr, add func(string)) {
		switch e.Kind() {
		case celast.SelectKind:
			if s := e.AsSelect(); isIdent(s.Operand(), "jwt") {
				add(s.FieldName())
			}
		case celast.CallKind:
			c := e.AsCall()
			if args := c.Args(); (c.FunctionName() == "_[_]" || c.FunctionName() == "_[?_]") && len(args) == 2 && isIdent(args[0], "jwt") && args[1].Kind() == celast.LiteralKind {
				if k, ok := args[1].AsLiteral().Value().(string); ok {
					add(k)
				}
			}
		}
	})
}

// Functions returns the functions a CEL expression calls by name, operators
// included (_+_, _[_], ...), sorted; a macro counts as what it expands to.
func Functions(expr string) ([]string, error) {
	return collect(expr, func(e celast.Expr, add func(string)) {
		if e.Kind() == celast.CallKind {
			add(e.AsCall().FunctionName())
		}
	})
}

func isIdent(e celast.Expr, name string) bool {
	return e.Kind() == celast.IdentKind && e.AsIdent() == name
}

// collect parses expr and returns, sorted and without duplicates, what visit
// adds for each node of its AST.
func collect(expr string, visit func(e celast.Expr, add func(string))) ([]string, error) {
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
	add := func(s string) { seen[s] = true }
	celast.PreOrderVisit(celast.NavigateAST(ast.NativeRep()), celast.NewExprVisitor(func(e celast.Expr) { visit(e, add) }))
	out := make([]string, 0, len(seen))
	for v := range seen {
		out = append(out, v)
	}
	sort.Strings(out)
	return slices.Clip(out), nil
}
