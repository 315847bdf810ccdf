package agentgateway

import (
	"fmt"
	"sort"
	"strings"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
)

// Token fields of agentgateway's CEL variable llm (crates/agentgateway/src/cel/types.rs,
// LLMContext): a Tokens descriptor's cost without an expression is
// totalTokens; an expression decides alone what is charged.
const (
	LLMInputTokens  = "inputTokens"
	LLMOutputTokens = "outputTokens"
	LLMTotalTokens  = "totalTokens"
)

// LLMFields parses a CEL expression and returns the fields of llm it reads
// (llm.outputTokens, llm["outputTokens"]), sorted.
func LLMFields(expr string) ([]string, error) {
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
		switch e.Kind() {
		case celast.SelectKind:
			if op := e.AsSelect().Operand(); op.Kind() == celast.IdentKind && op.AsIdent() == "llm" {
				seen[e.AsSelect().FieldName()] = true
			}
		case celast.CallKind:
			c := e.AsCall()
			if c.FunctionName() != operators.Index || len(c.Args()) != 2 {
				return
			}
			if op, key := c.Args()[0], c.Args()[1]; op.Kind() == celast.IdentKind && op.AsIdent() == "llm" && key.Kind() == celast.LiteralKind {
				if s, ok := key.AsLiteral().Value().(string); ok {
					seen[s] = true
				}
			}
		}
	}))
	out := make([]string, 0, len(seen))
	for f := range seen {
		out = append(out, f)
	}
	sort.Strings(out)
	return out, nil
}
