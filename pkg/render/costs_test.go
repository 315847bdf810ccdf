package render

import (
	"math"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"

	"github.com/budgetgen/budgetgen/pkg/spec"
)

// aiGatewayEnv declares the variables Envoy AI Gateway's CEL cost programs
// get (internal/llmcostcel/cel.go: model and backend strings, five uint token
// counts), so the test compiles the expression exactly as the gateway would.
func aiGatewayEnv(t *testing.T) *cel.Env {
	t.Helper()
	env, err := cel.NewEnv(
		cel.Variable("model", cel.StringType),
		cel.Variable("backend", cel.StringType),
		cel.Variable("input_tokens", cel.UintType),
		cel.Variable("cached_input_tokens", cel.UintType),
		cel.Variable("cached_write_input_tokens", cel.UintType),
		cel.Variable("output_tokens", cel.UintType),
		cel.Variable("total_tokens", cel.UintType),
	)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func evalCost(t *testing.T, env *cel.Env, expr, model string, in, cached, out uint64) uint64 {
	t.Helper()
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		t.Fatalf("compile %s: %v", expr, iss.Err())
	}
	prg, err := env.Program(ast)
	if err != nil {
		t.Fatal(err)
	}
	v, _, err := prg.Eval(map[string]any{"model": model, "backend": "b", "input_tokens": in, "cached_input_tokens": cached,
		"cached_write_input_tokens": uint64(0), "output_tokens": out, "total_tokens": in + out})
	if err != nil {
		t.Fatalf("eval %s for %s: %v", expr, model, err)
	}
	u, ok := v.Value().(uint64)
	if !ok {
		t.Fatalf("result %v is %T, the AI Gateway wants an integer", v, v.Value())
	}
	return u
}

// TestCostExpressionEvaluates: the rendered CEL, run by cel-go in the AI
// Gateway's environment, gives the request's cost in 1/10,000 USD, rounded up.
func TestCostExpressionEvaluates(t *testing.T) {
	bs := load(t, "testdata/money.yaml")
	expr, err := CostExpression(bs.Spec.Pricing)
	if err != nil {
		t.Fatal(err)
	}
	env := aiGatewayEnv(t)
	for _, c := range []struct {
		name            string
		model           string
		in, cached, out uint64
		want            uint64
	}{
		// 1M uncached input at $1.25/M + 100k output at $10/M = $2.25 = 22500 units.
		{"gpt-5 exact", "gpt-5", 1_000_000, 0, 100_000, 22_500},
		// Cached input at $0.125/M: 800k cached + 200k uncached + 0 out = $0.1 + $0.25 = $0.35.
		{"gpt-5 cached", "gpt-5-2026-08-01", 1_000_000, 800_000, 0, 3_500},
		// gpt-5-mini matches its own entry first (order matters): 1M in = $0.25.
		{"first match wins", "gpt-5-mini", 1_000_000, 0, 0, 2_500},
		// One output token of opus is $0.000075: rounds up to one unit, never 0.
		{"rounds up", "claude-opus-4", 0, 0, 1, 1},
		{"nothing used costs nothing", "claude-opus-4", 0, 0, 0, 0},
		// An unpriced model gets the default price ($15/M in, $75/M out), not 0.
		{"default price", "llama-4", 1_000_000, 0, 1_000_000, 900_000},
		// A full match: "xgpt-5" is not gpt-5.
		{"regex anchored", "xgpt-5", 1_000_000, 0, 0, 150_000},
		// A gateway reporting more cached than input tokens does not underflow.
		{"cached above input", "gpt-5", 100, 200, 0, 1},
		// The largest counts the AI Gateway passes (uint32) at the priciest entry do not overflow.
		{"uint32 counts", "claude-opus-4", math.MaxUint32, 0, math.MaxUint32, 3_865_470_566},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := evalCost(t, env, expr, c.model, c.in, c.cached, c.out); got != c.want {
				t.Fatalf("cost = %d units, want %d", got, c.want)
			}
		})
	}
}

func TestKiloTokenExpression(t *testing.T) {
	env := aiGatewayEnv(t)
	for _, c := range []struct{ in, out, want uint64 }{{0, 0, 0}, {1, 0, 1}, {999, 1, 1}, {1000, 1, 2}, {2_000_000, 0, 2000}} {
		if got := evalCost(t, env, KiloTokenExpression, "m", c.in, 0, c.out); got != c.want {
			t.Errorf("%d+%d tokens = %d units, want %d", c.in, c.out, got, c.want)
		}
	}
}

func TestRenderRefusesWhatItCannotExpress(t *testing.T) {
	bs := load(t, "testdata/large_cap.yaml")
	bs.Spec.TokenSource = spec.TokenSource{Namespace: "my.filter", Key: "tokens"}
	_, err := Render(bs)
	var ue *UnsupportedError
	if err == nil || !asUnsupported(err, &ue) || !strings.Contains(err.Error(), "spec.budgets[0].limits[0]") || !strings.Contains(err.Error(), "spec.tokenSource is my.filter/tokens") {
		t.Fatalf("err = %v, want the large cap refused with the token source as reason", err)
	}
	money := load(t, "testdata/money.yaml")
	money.Spec.Pricing.Default = nil // validation requires it; render must not silently price 0
	if _, err := Render(money); err == nil || !strings.Contains(err.Error(), "spec.pricing.default") {
		t.Fatalf("err = %v, want the missing default price refused", err)
	}
}

func asUnsupported(err error, target **UnsupportedError) bool {
	ue, ok := err.(*UnsupportedError)
	if ok {
		*target = ue
	}
	return ok
}
