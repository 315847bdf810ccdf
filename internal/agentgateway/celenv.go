package agentgateway

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
)

// NoClaim is the descriptor value budgetgen renders for a request whose
// verified JWT lacks the claim (or that carries no verified JWT: jwt
// Optional or Permissive mode): one shared bucket, capped like any principal,
// instead of a descriptor agentgateway drops (an entry whose expression fails
// drops its descriptor, and with every descriptor dropped no rate limit call
// is made: crates/agentgateway/src/http/remoteratelimit.rs, build_request).
// On Envoy Gateway it is the fixed principal of each per-principal budget's
// rule for requests carrying none of the Gateway's identity headers
// (pkg/render, unidentified.go): with the budget map both gateways count such
// requests in one counter per budget.
const NoClaim = "budgetgen/no-claim"

// newEnv is the CEL environment the gate and the request simulation evaluate
// descriptor entries in: the variable jwt (the verified claims; absent when
// no JWT was verified) and agentgateway's coalesce and default
// (crates/celx/src/general.rs): coalesce returns its first argument that
// evaluates without an error and is not null, default its first argument
// unless that is null or a missing key or variable (NoSuchKey,
// UndeclaredReference), passing any other error on. cel-go evaluates
// arguments strictly, so both are declared non-strict (they receive errors as
// values). Up to three arguments of coalesce are modelled.
func newEnv() (*cel.Env, error) {
	fallback := func(args ...ref.Val) ref.Val {
		for _, a := range args {
			if !types.IsUnknownOrError(a) && a != types.NullValue {
				return a
			}
		}
		return args[len(args)-1]
	}
	dflt := func(a, b ref.Val) ref.Val {
		if a == types.NullValue || missing(a) {
			return b
		}
		return a
	}
	dyn := cel.DynType
	return cel.NewEnv(
		cel.Variable("jwt", cel.MapType(cel.StringType, dyn)),
		cel.Function("coalesce",
			cel.Overload("coalesce_2", []*cel.Type{dyn, dyn}, dyn, cel.OverloadIsNonStrict(), cel.BinaryBinding(func(a, b ref.Val) ref.Val { return fallback(a, b) })),
			cel.Overload("coalesce_3", []*cel.Type{dyn, dyn, dyn}, dyn, cel.OverloadIsNonStrict(), cel.FunctionBinding(fallback))),
		cel.Function("default",
			cel.Overload("default_2", []*cel.Type{dyn, dyn}, dyn, cel.OverloadIsNonStrict(), cel.BinaryBinding(dflt))),
	)
}

// missing reports whether v is cel-go's error for a map key or a variable
// that is not there: agentgateway's NoSuchKey and UndeclaredReference, the
// only errors its default() replaces. cel-go has no error types for them,
// so its messages are matched ("no such key: k", "no such attribute(s): jwt").
func missing(v ref.Val) bool {
	e, ok := v.(*types.Err)
	if !ok {
		return false
	}
	msg := e.Error()
	return strings.HasPrefix(msg, "no such key") || strings.HasPrefix(msg, "no such attribute")
}

// ErrUnmodelled is returned (wrapped) by EvalEntry for an expression this
// environment cannot compile (a variable or function of agentgateway's CEL
// other than jwt, coalesce and default): its outcome is unknown here.
var ErrUnmodelled = errors.New("expression outside the modelled CEL environment")

// Evaluator evaluates descriptor entries in the environment of newEnv,
// compiling each expression once. Not safe for concurrent use.
type Evaluator struct {
	env   *cel.Env
	progs map[string]compiled
}

type compiled struct {
	prg cel.Program
	err error
}

// NewEvaluator builds the CEL environment once.
func NewEvaluator() (*Evaluator, error) {
	env, err := newEnv()
	if err != nil {
		return nil, fmt.Errorf("cel environment: %w", err)
	}
	return &Evaluator{env: env, progs: map[string]compiled{}}, nil
}

// EvalEntry evaluates a descriptor entry's expression as agentgateway would
// for a request whose verified claims are claims (nil: no verified JWT at
// all), and returns the entry's value. An error means agentgateway drops the
// descriptor (the expression fails, or its value is not a string), or, when
// it wraps ErrUnmodelled, that the expression is outside this environment.
func EvalEntry(expr string, claims map[string]any) (string, error) {
	e, err := NewEvaluator()
	if err != nil {
		return "", err
	}
	return e.Eval(expr, claims)
}

// Eval is EvalEntry with the compiled programs kept.
func (e *Evaluator) Eval(expr string, claims map[string]any) (string, error) {
	c, ok := e.progs[expr]
	if !ok {
		ast, iss := e.env.Compile(expr)
		if iss != nil && iss.Err() != nil {
			c.err = fmt.Errorf("%w: %v", ErrUnmodelled, iss.Err())
		} else {
			c.prg, c.err = e.env.Program(ast)
		}
		e.progs[expr] = c
	}
	if c.err != nil {
		return "", c.err
	}
	vars := map[string]any{}
	if claims != nil {
		vars["jwt"] = claims
	}
	v, _, err := c.prg.Eval(vars)
	if err != nil {
		return "", err
	}
	s, ok := v.Value().(string)
	if !ok {
		return "", fmt.Errorf("the value is %s, not a string", v.Type())
	}
	return s, nil
}
