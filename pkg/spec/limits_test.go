package spec

import (
	"strings"
	"testing"
)

const withLimits = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: ai-budgets}
spec:
  gateways: [{namespace: ai-gateway, name: agent-router}]
  identities:
    x-api-key-client: {apiKeyClientID: true}
  pricing:
    models:
      - {model: "gpt-5.*", input: 1.25, cachedInput: 0.125, output: 10}
    default: {input: 15, output: 75}
  budgets:
    - name: per-key
      perPrincipal: x-api-key-client
      limits:
        - {tokens: 5000000, per: day}
        - {tokens: 50000000, per: month}
        - {cost: 500, per: month}
      overrides:
        - {principal: acme, limits: [{tokens: 6000000000, per: month}]}
  frontier:
    models: ["gpt-5.*"]
    limits: [{tokens: 200000000, per: week}]
`

func TestLoadLimitsAndPricing(t *testing.T) {
	bs, err := Load([]byte(withLimits), "b.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b := &bs.Spec.Budgets[0]
	if ls := b.AllLimits(); len(ls) != 3 || ls[1].Window() != PeriodMonth || ls[2].Cost != "500" || !ls[2].IsCost() {
		t.Fatalf("limits = %+v", ls)
	}
	if DailyTokens(b.AllLimits()) != 5000000 {
		t.Errorf("daily tokens = %d", DailyTokens(b.AllLimits()))
	}
	if o := b.Overrides[0].AllLimits(); len(o) != 1 || o[0].Tokens != 6_000_000_000 {
		t.Errorf("override limits = %+v", o)
	}
	if bs.Spec.Pricing.Currency != "USD" {
		t.Errorf("currency default = %q", bs.Spec.Pricing.Currency)
	}
	sp, err := bs.Spec.Pricing.Models[0].Scaled()
	// Cache writes default to twice the input price (never billed too little).
	if err != nil || sp != (ScaledPrice{Input: 1_250_000, CachedInput: 125_000, CacheWrite: 2_500_000, Output: 10_000_000}) {
		t.Errorf("scaled price = %+v %v", sp, err)
	}
	// The shorthand still works and means one daily limit.
	short, err := Load([]byte(base), "b.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if ls := short.Spec.Budgets[0].AllLimits(); len(ls) != 1 || ls[0] != (Limit{Tokens: 5000000, Per: PeriodDay}) {
		t.Errorf("shorthand = %+v", ls)
	}
}

func TestLimitErrors(t *testing.T) {
	for _, tc := range []struct {
		name, from, to, want string
	}{
		{"both forms", "      limits:\n        - {tokens: 5000000, per: day}", "      tokensPerDay: 5\n      limits:\n        - {tokens: 5000000, per: day}",
			"b.yaml:17: spec.budgets[0].limits: set either tokensPerDay or limits, not both"},
		{"unknown period", "{tokens: 5000000, per: day}", "{tokens: 5000000, per: fortnight}",
			`b.yaml:16: spec.budgets[0].limits[0].per: unknown period "fortnight": must be hour, day, week or month`},
		{"tokens and cost", "{cost: 500, per: month}", "{cost: 500, tokens: 5, per: month}",
			"b.yaml:18: spec.budgets[0].limits[2]: set either tokens or cost, not both"},
		{"large cap not a multiple of 1000", "{tokens: 6000000000, per: month}", "{tokens: 6000000001, per: month}",
			"b.yaml:20: spec.budgets[0].overrides[0].limits[0].tokens: caps above 4294967295 are charged in units of 1000 tokens: write a multiple of 1000 (e.g. 6000000000)"},
		{"cap past the unit scheme", "{tokens: 6000000000, per: month}", "{tokens: 5000000000000, per: month}",
			"b.yaml:20: spec.budgets[0].overrides[0].limits[0].tokens: must be at most 4294967295000"},
		{"duplicate window", "{tokens: 50000000, per: month}", "{tokens: 50000000, per: day}",
			"b.yaml:17: spec.budgets[0].limits[1]: a second tokens limit per day (first at limits[0])"},
		{"cost with too many decimals", "{cost: 500, per: month}", "{cost: 500.00001, per: month}",
			`b.yaml:18: spec.budgets[0].limits[2].cost: "500.00001" has more decimal places than 1/10000`},
		{"cost too large", "{cost: 500, per: month}", "{cost: 500000, per: month}",
			"b.yaml:18: spec.budgets[0].limits[2].cost: must be at most 429496"},
		{"negative cost", "{cost: 500, per: month}", "{cost: -5, per: month}",
			`b.yaml:18: spec.budgets[0].limits[2].cost: must be a non-negative decimal number, got "-5"`},
		{"no default price", "    default: {input: 15, output: 75}\n", "",
			"b.yaml:9: spec.pricing.default: is required: a request for a model no entry matches would otherwise cost nothing"},
		{"bad currency", "  pricing:\n", "  pricing:\n    currency: usd\n",
			`b.yaml:9: spec.pricing.currency: must be an ISO 4217 code of three capital letters (USD, EUR), got "usd"`},
		{"bad price", "input: 1.25,", "input: 1.2500001,",
			`b.yaml:10: spec.pricing.models[0].input: "1.2500001" has more decimal places than 1/1000000 (prices per million tokens keep at most 6 decimal places)`},
		{"prices that could overflow the cost", "input: 1.25, cachedInput: 0.125, output: 10}", "input: 1000, cachedInput: 1000, output: 1000}",
			"b.yaml:10: spec.pricing.models[0]: input, cachedInput, cacheWrite (default 2x input) and output add up to more than 4000 per million tokens"},
		{"bad cache write price", "input: 1.25,", "input: 1.25, cacheWrite: 1001,",
			"b.yaml:10: spec.pricing.models[0].cacheWrite: must be at most 1000 per million tokens"},
		{"bad model regex", `model: "gpt-5.*"`, `model: "gpt-(5"`,
			"b.yaml:10: spec.pricing.models[0].model: invalid regular expression"},
		{"cost without pricing", "  pricing:\n    models:\n      - {model: \"gpt-5.*\", input: 1.25, cachedInput: 0.125, output: 10}\n    default: {input: 15, output: 75}\n", "",
			"b.yaml:14: spec.budgets[0].limits[2].cost: a cost limit needs spec.pricing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(withLimits, tc.from) {
				t.Fatalf("fixture has no %q", tc.from)
			}
			_, err := Load([]byte(strings.Replace(withLimits, tc.from, tc.to, 1)), "b.yaml")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error:\n got %v\nwant %s", err, tc.want)
			}
		})
	}
}

func FuzzAmountScaled(f *testing.F) {
	for _, s := range []string{"500", "0.075", "1.2500001", "-1", "1e3", "", "99999999999999999999", "0x10", "1/3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Amount(s).Scaled(CostScale)
		if err == nil && n < 0 {
			t.Fatalf("%q scaled to a negative %d", s, n)
		}
	})
}

// One token type for every Gateway: the rendered GatewayConfigs agree, and a
// type other than TotalToken is rendered on every Gateway (agentgateway
// always counts total tokens).
func TestTokenType(t *testing.T) {
	const doc = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: b}
spec:
  gateways:
    - {namespace: a, name: g1, gatewayConfig: {name: c, type: OutputToken}}
    - {namespace: a, name: g2, gatewayConfig: {name: c, type: OutputToken}}
  identities:
    x-run: {jwtClaim: run}
  budgets:
    - {name: per-run, perPrincipal: x-run, tokensPerDay: 5000000}
`
	bs, err := Load([]byte(doc), "b.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if bs.TokenType() != "OutputToken" {
		t.Errorf("token type = %q", bs.TokenType())
	}
	short, err := Load([]byte(strings.Replace(doc, ", gatewayConfig: {name: c, type: OutputToken}}", "}", 2)), "b.yaml")
	if err != nil || short.TokenType() != DefaultGatewayConfigType {
		t.Fatalf("no GatewayConfig: %v, %v", err, short)
	}
	for _, c := range []struct{ from, to, want string }{
		{"name: g2, gatewayConfig: {name: c, type: OutputToken}}", "name: g2, gatewayConfig: {name: c, type: TotalToken}}",
			"b.yaml:7: spec.gateways[1].gatewayConfig.type: TotalToken, but spec.gateways[0] counts OutputToken"},
		{"name: g2, gatewayConfig: {name: c, type: OutputToken}}", "name: g2}",
			"b.yaml:7: spec.gateways[1]: needs gatewayConfig (type OutputToken, as spec.gateways[0])"},
		{"name: g2, gatewayConfig: {name: c, type: OutputToken}}", "name: g2, kind: agentgateway}",
			"b.yaml:7: spec.gateways[1]: agentgateway counts total tokens, but spec.gateways[0].gatewayConfig.type is OutputToken"},
	} {
		_, err := Load([]byte(strings.Replace(doc, c.from, c.to, 1)), "b.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n got %v\nwant %s", c.to, err, c.want)
		}
	}
}
