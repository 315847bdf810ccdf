package assert

import (
	"context"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// Default token metadata: where Envoy AI Gateway's llmRequestCosts writes a
// response's token count.
const (
	DefaultTokenNamespace = "io.envoy.ai_gateway"
	DefaultTokenKey       = "llm_total_token"
	// DefaultModelHeader is the header Envoy AI Gateway sets from the request's model.
	DefaultModelHeader = "x-ai-eg-model"
)

// RuleBudgetsAnnotation is the annotation budgetgen render puts on every
// BackendTrafficPolicy: JSON [{"rule":i,"budget":name,"kind":"tokens"|"killswitch","principal":...}].
const RuleBudgetsAnnotation = "budgetgen.dev/rule-budgets"

// Options configure a run. The zero value checks without a spec, without
// schema validation, drift or version hazards.
type Options struct {
	// Skip lists rule IDs not to run.
	Skip []string
	// Spec carries the facts of the BudgetSet given with --spec; nil without it.
	Spec *SpecFacts
	// AllowEnforce names rules allowed to enforce without --spec: a budget
	// name from the rule-budgets annotation, or a rule as
	// <namespace>/<policy>/rule/<i> (EG's descriptor name for it).
	AllowEnforce []string
	// EnvoyGatewayVersion (e.g. v1.8.1) enables BG010; empty disables it.
	EnvoyGatewayVersion string
	// Validator checks objects against Envoy Gateway's CRD schema and CEL (BG007); nil disables it.
	Validator Validator
	// Rendered is what render produces now from the spec (BG008); nil disables drift.
	Rendered []*manifest.Object
}

// SpecFacts is what the gate needs from a BudgetSet, kept free of pkg/spec's
// types so the rules stay testable on their own.
type SpecFacts struct {
	// File is the spec's path, used to place findings about the spec itself.
	File string
	// Enforced names the budgets in mode enforce ("frontier" for the frontier cap).
	Enforced map[string]bool
	// Budgets names every budget of the spec; nil means "not known" (only
	// Enforced is consulted).
	Budgets map[string]bool
	// TokenNamespace and TokenKey are the response metadata of token cost.
	// Defaults: DefaultTokenNamespace, DefaultTokenKey.
	TokenNamespace string
	TokenKey       string
	// ModelHeader is the header matched by the frontier cap. Default DefaultModelHeader.
	ModelHeader string
}

// Validator validates one object against a schema.
type Validator interface {
	Validate(ctx context.Context, obj *manifest.Object) ([]FieldError, error)
}

// ValidatorFunc adapts a function to Validator.
type ValidatorFunc func(ctx context.Context, obj *manifest.Object) ([]FieldError, error)

// Validate calls f.
func (f ValidatorFunc) Validate(ctx context.Context, obj *manifest.Object) ([]FieldError, error) {
	return f(ctx, obj)
}

// FieldError is one schema or CEL violation. Path is a dotted field path
// with [i] indexes (spec.rateLimit.global.rules[0].limit.unit), "" for the
// whole object.
type FieldError struct {
	Path    string
	Message string
}

func (o Options) withDefaults() Options {
	if o.Spec != nil {
		s := *o.Spec
		if s.TokenNamespace == "" {
			s.TokenNamespace = DefaultTokenNamespace
		}
		if s.TokenKey == "" {
			s.TokenKey = DefaultTokenKey
		}
		if s.ModelHeader == "" {
			s.ModelHeader = DefaultModelHeader
		}
		o.Spec = &s
	}
	return o
}

func (o *Options) tokenMetadata() (ns, key string) {
	if o.Spec != nil {
		return o.Spec.TokenNamespace, o.Spec.TokenKey
	}
	return DefaultTokenNamespace, DefaultTokenKey
}

func (o *Options) modelHeader() string {
	if o.Spec != nil {
		return o.Spec.ModelHeader
	}
	return DefaultModelHeader
}
