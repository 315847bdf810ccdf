package render

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"

	"github.com/budgetgen/budgetgen/internal/aigateway"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/spec"
	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// The expressions are compiled and run in internal/aigateway's environment,
// a copy of Envoy AI Gateway v1.1.0's internal/llmcostcel/cel.go (variables,
// types, default limits, the sanity evaluation and the result check), with
// the uint32 counts AI Gateway passes.

func evalCost(t *testing.T, expr string, in aigateway.CostInput) uint64 {
	t.Helper()
	p, err := aigateway.NewCostProgram(expr)
	if err != nil {
		t.Fatalf("AI Gateway would refuse %s: %v", expr, err)
	}
	v, err := p.Eval(in)
	if err != nil {
		t.Fatalf("eval %s for %+v: %v", expr, in, err)
	}
	return v
}

// The environment is AI Gateway's: the variable that never existed in a
// release (cached_write_input_tokens) is refused, the real ones compile.
func TestCostEnvironmentIsAIGateways(t *testing.T) {
	if _, err := aigateway.NewCostProgram("cached_write_input_tokens"); err == nil {
		t.Fatal("cached_write_input_tokens compiled: the environment is not AI Gateway v1.1.0's")
	}
	for _, v := range []string{"input_tokens + cached_input_tokens + cache_creation_input_tokens + output_tokens + total_tokens + reasoning_tokens",
		`model == "m" && backend == "b" && route_name == "r" ? 1u : 0u`} {
		if _, err := aigateway.NewCostProgram(v); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
	// A negative int fails at AI Gateway's sanity evaluation.
	if _, err := aigateway.NewCostProgram("-1"); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("negative result: %v", err)
	}
}

// TestCostExpressionEvaluates: the rendered CEL gives the request's cost in
// 1/10,000 USD, rounded up.
func TestCostExpressionEvaluates(t *testing.T) {
	bs := load(t, "testdata/money.yaml")
	expr, err := CostExpression(bs.Spec.Pricing)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name                   string
		model                  string
		in, cached, write, out uint32
		want                   uint64
	}{
		// 1M uncached input at $1.25/M + 100k output at $10/M = $2.25 = 22500 units.
		{"gpt-5 exact", "gpt-5", 1_000_000, 0, 0, 100_000, 22_500},
		// Cached input at $0.125/M: 800k cached + 200k uncached + 0 out = $0.1 + $0.25 = $0.35.
		{"gpt-5 cached", "gpt-5-2026-08-01", 1_000_000, 800_000, 0, 0, 3_500},
		// Cache writes are part of input_tokens and cost twice the input
		// price by default: 400k written ($1) + 600k plain ($0.75) = $1.75.
		{"gpt-5 cache write", "gpt-5", 1_000_000, 0, 400_000, 0, 17_500},
		// claude-opus-4's own cacheWrite price ($18.75/M): 1M written = $18.75.
		{"explicit cache write price", "claude-opus-4", 1_000_000, 0, 1_000_000, 0, 187_500},
		// gpt-5-mini matches its own entry first (order matters): 1M in = $0.25.
		{"first match wins", "gpt-5-mini", 1_000_000, 0, 0, 0, 2_500},
		// One output token of opus is $0.000075: rounds up to one unit, never 0.
		{"rounds up", "claude-opus-4", 0, 0, 0, 1, 1},
		{"nothing used costs nothing", "claude-opus-4", 0, 0, 0, 0, 0},
		// An unpriced model gets the default price ($15/M in, $75/M out), not 0.
		{"default price", "llama-4", 1_000_000, 0, 0, 1_000_000, 900_000},
		// A full match: "xgpt-5" is not gpt-5.
		{"regex anchored", "xgpt-5", 1_000_000, 0, 0, 0, 150_000},
		// A gateway reporting more cached than input tokens does not underflow.
		{"cached above input", "gpt-5", 100, 200, 0, 0, 1},
		// The largest counts AI Gateway passes (uint32) at the priciest entry do not overflow.
		{"uint32 counts", "claude-opus-4", math.MaxUint32, math.MaxUint32, math.MaxUint32, math.MaxUint32, 4_090_956_349},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := evalCost(t, expr, aigateway.CostInput{Model: c.model, Backend: "b", RouteName: "r",
				Input: c.in, CachedInput: c.cached, CacheCreationInput: c.write, Output: c.out, Total: c.in + c.out})
			if got != c.want {
				t.Fatalf("cost = %d units, want %d", got, c.want)
			}
		})
	}
}

// TestCostExpressionMatchesPriceTable: on random counts (uint32 extremes
// included) and every model of the table, the expression equals the cost
// computed here in exact arithmetic, rounded up to a unit.
func TestCostExpressionMatchesPriceTable(t *testing.T) {
	bs := load(t, "testdata/money.yaml")
	pr := bs.Spec.Pricing
	expr, err := CostExpression(pr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := aigateway.NewCostProgram(expr)
	if err != nil {
		t.Fatal(err)
	}
	models := []string{"gpt-5", "gpt-5-mini", "gpt-5-mini-2026", "claude-opus-4", "llama-4", "xgpt-5", ""}
	rng := rand.New(rand.NewPCG(1, 2))
	count := func() uint32 {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return math.MaxUint32 - uint32(rng.IntN(3))
		}
		return uint32(rng.IntN(2_000_000))
	}
	for i := 0; i < 5000; i++ {
		in := aigateway.CostInput{Model: models[i%len(models)], Input: count(), CachedInput: count(), CacheCreationInput: count(), Output: count()}
		got, err := p.Eval(in)
		if err != nil {
			t.Fatalf("%+v: %v", in, err)
		}
		if want := referenceCost(t, pr, in); got != want {
			t.Fatalf("%+v: cost %d, want %d", in, got, want)
		}
	}
}

// referenceCost prices a request in big integers from the spec's table.
func referenceCost(t *testing.T, pr *spec.Pricing, in aigateway.CostInput) uint64 {
	price := *pr.Default
	for _, m := range pr.Models {
		if regexp.MustCompile("^(?:" + m.Model + ")$").MatchString(in.Model) {
			price = m.Price
			break
		}
	}
	sp, err := price.Scaled()
	if err != nil {
		t.Fatal(err)
	}
	uncached := int64(in.Input) - int64(in.CachedInput) - int64(in.CacheCreationInput)
	sum := new(big.Int)
	for _, term := range [][2]int64{{max(uncached, 0), sp.Input}, {int64(in.CachedInput), sp.CachedInput}, {int64(in.CacheCreationInput), sp.CacheWrite}, {int64(in.Output), sp.Output}} {
		sum.Add(sum, new(big.Int).Mul(big.NewInt(term[0]), big.NewInt(term[1])))
	}
	unit := big.NewInt(picoPerUnit)
	sum.Add(sum, new(big.Int).Sub(unit, big.NewInt(1)))
	return sum.Div(sum, unit).Uint64()
}

// The kilotoken expression counts the spec's token type: with a
// GatewayConfig of OutputToken, a large cap counts output tokens like the
// budget's other caps, not total tokens.
func TestKiloTokenExpressionFollowsTokenType(t *testing.T) {
	for _, c := range []struct {
		typ  string
		in   aigateway.CostInput
		want uint64
	}{
		{"TotalToken", aigateway.CostInput{Input: 999, Output: 1, Total: 1000}, 1},
		{"TotalToken", aigateway.CostInput{Input: 1000, Output: 1, Total: 1001}, 2},
		{"TotalToken", aigateway.CostInput{Total: 2_000_000}, 2000},
		{"OutputToken", aigateway.CostInput{Input: 5000, Output: 1500, Total: 6500}, 2},
		{"InputToken", aigateway.CostInput{Input: 5000, Output: 1500, Total: 6500}, 5},
		{"ReasoningToken", aigateway.CostInput{Reasoning: 1}, 1},
		{"CacheCreationInputToken", aigateway.CostInput{CacheCreationInput: 3001}, 4},
		{"CachedInputToken", aigateway.CostInput{CachedInput: 0}, 0},
	} {
		expr, err := KiloTokenExpression(c.typ)
		if err != nil {
			t.Fatal(err)
		}
		if got := evalCost(t, expr, c.in); got != c.want {
			t.Errorf("%s %+v = %d units, want %d", c.typ, c.in, got, c.want)
		}
	}
	bs := load(t, "testdata/large_cap.yaml")
	bs.Spec.Gateways[0].GatewayConfig = &spec.GatewayConfig{Name: "c", Type: "OutputToken"}
	costs, err := LLMRequestCosts(bs)
	if err != nil || len(costs) != 1 || !strings.HasPrefix(costs[0].CEL, "(output_tokens +") {
		t.Fatalf("costs = %+v, %v; want the kilotoken key counting output tokens", costs, err)
	}
}

// Past AI Gateway's parser limits, render fails with the spec's line instead
// of emitting a GatewayConfig AI Gateway refuses whole; below them, what
// render emits compiles.
func TestCostExpressionWithinAIGatewayLimits(t *testing.T) {
	withModels := func(n int) *spec.BudgetSet {
		var b strings.Builder
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, "      - {model: \"m%d-.*\", input: 1, output: 2}\n", i)
		}
		src := strings.Replace(moneySpec, "MODELS\n", b.String(), 1)
		bs, err := spec.Load([]byte(src), "big.yaml")
		if err != nil {
			t.Fatal(err)
		}
		return bs
	}
	bs := withModels(120)
	costs, err := LLMRequestCosts(bs)
	if err != nil {
		t.Fatalf("120 models: %v", err)
	}
	if _, err := aigateway.NewCostProgram(costs[0].CEL); err != nil {
		t.Fatal(err)
	}
	_, err = Render(withModels(300))
	var fe *yamlpos.Error
	if err == nil || !asFieldError(err, &fe) || fe.File != "big.yaml" || fe.Line != 11 || fe.Path != "spec.pricing.models" ||
		!strings.Contains(err.Error(), "refused by Envoy AI Gateway's CEL compiler") {
		t.Fatalf("300 models: err = %v, want a positioned refusal", err)
	}
}

const moneySpec = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: spend}
spec:
  gateways: [{namespace: ai-gateway, name: agent-router}]
  identities:
    x-team: {extAuth: true}
  pricing:
    currency: USD
    models:
MODELS
    default: {input: 15, output: 75}
  budgets:
    - {name: per-team, perPrincipal: x-team, limits: [{cost: 500, per: month}]}
`

func asFieldError(err error, target **yamlpos.Error) bool {
	fe, ok := err.(*yamlpos.Error)
	if ok {
		*target = fe
	}
	return ok
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

// TestBudgetMapFollowsDeployedPolicy: the budget map names every budget rule
// as the deployed policy does (a base policy's name, its rules first), and a
// money rule's bucket is not its budget's token bucket (they would share a
// counter in the same window).
func TestBudgetMapFollowsDeployedPolicy(t *testing.T) {
	for _, name := range []string{"testdata/base_policy.yaml", "testdata/money.yaml"} {
		bs := load(t, name)
		res, err := Render(bs)
		if err != nil {
			t.Fatal(err)
		}
		entries := map[string]budgetmap.Entry{}
		for _, e := range BudgetMap(bs).Entries {
			entries[e.Domain+" "+e.Descriptor[0].Value] = e
		}
		n := 0
		for _, o := range res.Objects {
			btp, ok := o.Object.(*egv1a1.BackendTrafficPolicy)
			if !ok {
				continue
			}
			rbs, err := RuleBudgets(btp.Annotations)
			if err != nil {
				t.Fatal(err)
			}
			domain := btp.Namespace + "/" + btp.Name
			for _, rb := range rbs {
				e, ok := entries[domain+" "+budgetmap.RuleDescriptor(domain, rb.Rule)]
				if !ok {
					t.Fatalf("%s: rule %d of %s is not in the budget map", name, rb.Rule, domain)
				}
				n++
				_, budget, _, measure, ok := budgetmap.ParseBucket(e.Bucket)
				if !ok || budget != rb.Budget || (rb.Kind == budgetmap.KindTokens && measure != rb.Measure) {
					t.Errorf("%s: rule %d bucket %q, want budget %s measure %q", name, rb.Rule, e.Bucket, rb.Budget, rb.Measure)
				}
			}
		}
		if n != len(entries) {
			t.Errorf("%s: %d map entries, %d rules", name, len(entries), n)
		}
	}
}

// TestUnsupportedErrorsNameTheLine: a validated spec render cannot express
// fails with the spec's file, line and field path (indices, as validation
// names them), like every other spec error.
func TestUnsupportedErrorsNameTheLine(t *testing.T) {
	const head = "apiVersion: budgetgen.dev/v1alpha1\nkind: BudgetSet\nmetadata: {name: s}\nspec:\n  gateways:\n"
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"large cap, own token source", head + "    - {namespace: ns, name: gw1}\n  tokenSource: {key: my_tokens}\n  identities:\n    x-a: {jwtClaim: sub}\n  budgets:\n" +
			"    - {name: z, perPrincipal: x-a, tokensPerDay: 10, shadowSince: 2026-01-01}\n" +
			"    - name: a\n      perPrincipal: x-a\n      shadowSince: 2026-01-01\n      tokensPerDay: 10\n      overrides:\n" +
			"        - {principal: zed, tokensPerDay: 10}\n        - principal: bob\n          limits:\n            - {tokens: 5000000000, per: month}\n",
			"s.yaml:20: spec.budgets[1].overrides[1].limits[0]: a cap above 4294967295 tokens"},
		{"money on agentgateway", head + "    - {namespace: ns, name: gw1, kind: agentgateway}\n  identities:\n    x-a: {jwtClaim: sub}\n" +
			"  pricing:\n    models: [{model: x, input: 1, output: 1}]\n    default: {input: 1, output: 2}\n  budgets:\n" +
			"    - {name: z, perPrincipal: x-a, tokensPerDay: 10, shadowSince: 2026-01-01}\n" +
			"    - name: a\n      perPrincipal: x-a\n      shadowSince: 2026-01-01\n      limits:\n        - {cost: 5, per: month}\n",
			"s.yaml:18: spec.budgets[1].limits[0]: a money limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs, err := spec.Load([]byte(tc.doc), "s.yaml")
			if err != nil {
				t.Fatal(err)
			}
			_, err = Render(bs)
			var ue *UnsupportedError
			if !asUnsupported(err, &ue) || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("render error %v; want an UnsupportedError starting %q", err, tc.want)
			}
		})
	}
}
