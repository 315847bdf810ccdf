package aigateway

import (
	"fmt"
	"regexp"
	"strconv"

	"github.com/google/cel-go/cel"
)

// The CEL environment of an LLMRequestCost of type CEL, copied from Envoy AI
// Gateway v1.1.0, internal/llmcostcel/cel.go (package llmcostcel: the same
// variables, names and types, and cel.NewEnv's default parser limits, which
// cel-go v0.28.1 - AI Gateway's pin - and this module's cel-go share: a
// recursion depth of 250 and 100,000 code points per expression). AI Gateway's
// controller compiles every expression with NewProgram
// (internal/controller/gateway.go) and refuses the whole GatewayConfig or
// route when one fails; its external processor evaluates it per response
// (internal/extproc/processor_impl.go, evalCost) with the model name from the
// x-ai-eg-model request header, which holds the backend's modelNameOverride
// when the route's backendRef sets one.
const (
	CELModel                    = "model"
	CELBackend                  = "backend"
	CELRouteName                = "route_name"
	CELInputTokens              = "input_tokens"
	CELCachedInputTokens        = "cached_input_tokens"
	CELCacheCreationInputTokens = "cache_creation_input_tokens"
	CELOutputTokens             = "output_tokens"
	CELTotalTokens              = "total_tokens"
	CELReasoningTokens          = "reasoning_tokens"
)

// CostVariable maps an LLMRequestCost type to the CEL variable holding the
// same count, so an expression derived from a Gateway's token type counts
// the tokens that type counts.
var CostVariable = map[string]string{
	CostInputToken:              CELInputTokens,
	CostCachedInputToken:        CELCachedInputTokens,
	CostCacheCreationInputToken: CELCacheCreationInputTokens,
	CostOutputToken:             CELOutputTokens,
	CostTotalToken:              CELTotalTokens,
	CostReasoningToken:          CELReasoningTokens,
}

// CostEnv is AI Gateway's cost environment: model, backend and route_name
// strings and six uint token counts, default limits.
func CostEnv() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable(CELModel, cel.StringType),
		cel.Variable(CELBackend, cel.StringType),
		cel.Variable(CELRouteName, cel.StringType),
		cel.Variable(CELInputTokens, cel.UintType),
		cel.Variable(CELCachedInputTokens, cel.UintType),
		cel.Variable(CELCacheCreationInputTokens, cel.UintType),
		cel.Variable(CELOutputTokens, cel.UintType),
		cel.Variable(CELTotalTokens, cel.UintType),
		cel.Variable(CELReasoningTokens, cel.UintType),
	)
}

// CostInput is what AI Gateway passes a cost program for one response. The
// counts are uint32, as AI Gateway's EvaluateProgram takes them.
type CostInput struct {
	Model, Backend, RouteName                                        string
	Input, CachedInput, CacheCreationInput, Output, Total, Reasoning uint32
}

// CostProgram is a compiled cost expression.
type CostProgram struct{ prg cel.Program }

// NewCostProgram compiles expr as AI Gateway's NewProgram does, including its
// sanity evaluation with every count 0: an expression that fails here is one
// AI Gateway rejects.
func NewCostProgram(expr string) (*CostProgram, error) {
	env, err := CostEnv()
	if err != nil {
		return nil, fmt.Errorf("cel environment: %w", err)
	}
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		return nil, fmt.Errorf("cannot compile CEL expression: %w", iss.Err())
	}
	prg, err := env.Program(ast)
	if err != nil {
		return nil, fmt.Errorf("cannot create CEL program: %w", err)
	}
	p := &CostProgram{prg: prg}
	if _, err := p.Eval(CostInput{Model: "dummy", Backend: "dummy", RouteName: "dummy"}); err != nil {
		return nil, err
	}
	return p, nil
}

// Eval is AI Gateway's EvaluateProgram: the result must be an int >= 0 or a
// uint.
func (p *CostProgram) Eval(in CostInput) (uint64, error) {
	out, _, err := p.prg.Eval(map[string]any{
		CELModel: in.Model, CELBackend: in.Backend, CELRouteName: in.RouteName,
		CELInputTokens: in.Input, CELCachedInputTokens: in.CachedInput, CELCacheCreationInputTokens: in.CacheCreationInput,
		CELOutputTokens: in.Output, CELTotalTokens: in.Total, CELReasoningTokens: in.Reasoning,
	})
	if err != nil || out == nil {
		return 0, fmt.Errorf("failed to evaluate CEL expression: %w", err)
	}
	switch v := out.Value().(type) {
	case int64:
		if v < 0 {
			return 0, fmt.Errorf("CEL expression result is negative (%d)", v)
		}
		return uint64(v), nil
	case uint64:
		return v, nil
	}
	return 0, fmt.Errorf("CEL expression result is not an integer, got %v", out.Type())
}

// modelMatchRE finds the patterns of model.matches("...") calls.
var modelMatchRE = regexp.MustCompile(`\bmodel\.matches\(("(?:[^"\\]|\\.)*")\)`)

// ModelPatterns returns the RE2 patterns an expression matches the model
// name against (model.matches("...")), in order; ok is false when one does
// not unquote.
func ModelPatterns(expr string) (patterns []string, ok bool) {
	for _, m := range modelMatchRE.FindAllStringSubmatch(expr, -1) {
		p, err := strconv.Unquote(m[1])
		if err != nil {
			return nil, false
		}
		patterns = append(patterns, p)
	}
	return patterns, true
}
