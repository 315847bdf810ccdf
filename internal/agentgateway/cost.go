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

// CostTotalTokens is the cost budgetgen renders on a Tokens descriptor: the
// whole token count, as without a cost, but with three differences that make
// a budget's reservations hold (docs/agentgateway.md, "Descriptors of unit
// Tokens"): with a cost the request-time call always has hits_addend 0 (a
// check, even when agentgateway tokenizes the prompt); a response that
// reports no usage (an upstream error) leaves llm.totalTokens unset, so the
// cost fails and the descriptor is left out of the amend
// (remoteratelimit.rs, apply_token_amend) instead of being amended with 0,
// which the rate limit service cannot tell from a new check; and a response
// that reports a usage of 0 tokens is charged 1, for the same reason: its
// amend settles the request's hold instead of placing a second one. The
// comparison of the uint count with an int literal is a cross-type numeric
// comparison, which agentgateway's CEL (crates/cel-fork/cel/src/objects.rs,
// partial_cmp) and cel-go both evaluate.
const CostTotalTokens = "llm." + LLMTotalTokens + " > 0 ? llm." + LLMTotalTokens + " : 1"

// costEnv is the environment a cost expression is evaluated in here: the
// variable llm, a map holding only the counts the response reported (an
// unset Option of LLMContext is absent, so reading it fails).
func costEnv() (*cel.Env, error) {
	return cel.NewEnv(cel.Variable("llm", cel.MapType(cel.StringType, cel.DynType)))
}

// evalCost evaluates a Tokens descriptor's cost for a response; ok is false
// when agentgateway would leave the descriptor out of the amend (the
// expression fails or is not an unsigned number).
func evalCost(expr string, r LLMRequest) (uint64, bool, error) {
	env, err := costEnv()
	if err != nil {
		return 0, false, fmt.Errorf("cel environment: %w", err)
	}
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		return 0, false, fmt.Errorf("%w: cost %q: %v", ErrUnmodelled, expr, iss.Err())
	}
	prg, err := env.Program(ast)
	if err != nil {
		return 0, false, fmt.Errorf("cost %q: %w", expr, err)
	}
	llm := map[string]any{}
	if !r.NoUsage {
		llm[LLMInputTokens] = r.InputTokens
		llm[LLMOutputTokens] = r.OutputTokens
		llm[LLMTotalTokens] = r.InputTokens + r.OutputTokens
	}
	v, _, err := prg.Eval(map[string]any{"llm": llm})
	if err != nil {
		return 0, false, nil
	}
	switch n := v.Value().(type) {
	case uint64:
		return n, true, nil
	case int64:
		if n >= 0 {
			return uint64(n), true, nil
		}
	}
	return 0, false, nil
}

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
