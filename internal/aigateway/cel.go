package aigateway

import (
	"fmt"
	"sort"
	"strings"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
)

// CostVariables compiles a CEL cost expression in Envoy AI Gateway's
// environment (CostEnv) and returns the variables it reads, sorted. An error
// is what the controller would refuse.
func CostVariables(expr string) ([]string, error) {
	env, err := CostEnv()
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
