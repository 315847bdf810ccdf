package aigateway

import (
	"fmt"
	"sort"
	"strings"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
)

// CEL cost variables of Envoy AI Gateway v1.1.0 (internal/llmcostcel/cel.go:
// model, backend and route_name are strings, the token counts uints). The
// controller compiles a CEL cost in this environment and refuses the route
// (or GatewayConfig) when it does not compile or its evaluation on zero
// counts fails (llmcostcel.NewProgram).
const (
	CELInputTokens              = "input_tokens"
	CELCachedInputTokens        = "cached_input_tokens"
	CELCacheCreationInputTokens = "cache_creation_input_tokens"
	CELOutputTokens             = "output_tokens"
	CELTotalTokens              = "total_tokens"
	CELReasoningTokens          = "reasoning_tokens"
)

// CostVariables compiles a CEL cost expression in Envoy AI Gateway's
// environment and returns the variables it reads, sorted. An error is what
// the controller would refuse.
func CostVariables(expr string) ([]string, error) {
	env, err := cel.NewEnv(
		cel.Variable("model", cel.StringType),
		cel.Variable("backend", cel.StringType),
		cel.Variable("route_name", cel.StringType),
		cel.Variable(CELInputTokens, cel.UintType),
		cel.Variable(CELCachedInputTokens, cel.UintType),
		cel.Variable(CELCacheCreationInputTokens, cel.UintType),
		cel.Variable(CELOutputTokens, cel.UintType),
		cel.Variable(CELTotalTokens, cel.UintType),
		cel.Variable(CELReasoningTokens, cel.UintType),
	)
	if err != nil {
		return nil, fmt.Errorf("cel environment: %w", err)
	}
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		msg, _, _ := strings.Cut(iss.Err().Error(), "\n")
		return nil, fmt.Errorf("does not compile in Envoy AI Gateway's CEL environment: %s", msg)
	}
	if t := ast.OutputType(); t != cel.IntType && t != cel.UintType && t != cel.DynType {
		return nil, fmt.Errorf("returns %s, not an integer", t)
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
	return out, nil
}
