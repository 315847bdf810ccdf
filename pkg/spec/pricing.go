package spec

import (
	"fmt"
	"regexp"
	"strings"
)

// DefaultCurrency is the currency of spec.pricing when it does not say.
const DefaultCurrency = "USD"

// PriceScale is how many units a per-million-token price is kept in: a
// price is exact to 1/1,000,000 of the currency per million tokens (one
// millionth of a cent per ten thousand tokens), i.e. a whole number of
// 10^-12 currency per token.
const PriceScale = 1_000_000

// MaxPrice is the largest price per million tokens (currency units) of one
// token kind.
const MaxPrice = 1000

// MaxPriceSum bounds the four prices of one entry together (input, cached
// input, cache write and output, per million tokens): with it, a request's
// cost in 10^-12 currency stays within the uint64 of the CEL expression
// whatever the uint32 token counts AI Gateway passes (4 x 10^9 x (2^32-1)
// plus the rounding term is below 2^64); cel-go fails on an overflow, and AI
// Gateway then writes no cost at all.
const MaxPriceSum = 4000

// DefaultCacheWriteFactor prices cache-write tokens when cacheWrite is not
// given: twice the input price, the most a provider bills for them
// (Anthropic's 1-hour cache writes; 5-minute ones are 1.25x), so a request is
// never charged too little.
const DefaultCacheWriteFactor = 2

var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

// Pricing is the price table that turns a request's token counts into money,
// for cost limits. Envoy AI Gateway computes the cost per request with a CEL
// expression budgetgen renders from it (docs/spec.md, "Money").
type Pricing struct {
	// Currency is an ISO 4217 code. Default USD. Every cost limit is in it.
	Currency string `json:"currency,omitempty" jsonschema:"pattern=^[A-Z]{3}$"`
	// Models are matched in order against the model name Envoy AI Gateway
	// gives the cost expression (RE2, full match); the first match prices the
	// request. That name is the x-ai-eg-model header: the backend's
	// modelNameOverride when the route's backendRef sets one, else the model
	// the request asked for (AI Gateway internal/extproc/processor_impl.go).
	Models []ModelPrice `json:"models" jsonschema:"minItems=1"`
	// Default prices a model no entry matches. Required: a request for an
	// unpriced model must never cost nothing.
	Default *Price `json:"default,omitempty"`
}

// ModelPrice is the price of the models whose name matches Model.
type ModelPrice struct {
	// Model is an RE2 regular expression matched against the full model name.
	Model string `json:"model" jsonschema:"minLength=1"`
	Price
}

// Price is what a million tokens cost, in the pricing currency.
type Price struct {
	// Input is the price per million uncached input tokens.
	Input Amount `json:"input"`
	// CachedInput is the price per million cached input tokens (cache reads); default Input.
	CachedInput Amount `json:"cachedInput,omitempty"`
	// CacheWrite is the price per million input tokens written to the
	// provider's prompt cache (AI Gateway's cache_creation_input_tokens);
	// default twice Input (DefaultCacheWriteFactor).
	CacheWrite Amount `json:"cacheWrite,omitempty"`
	// Output is the price per million output tokens.
	Output Amount `json:"output"`
}

// ScaledPrice is a Price in 10^-12 currency per token (= PriceScale units per
// million tokens), defaults applied.
type ScaledPrice struct {
	Input, CachedInput, CacheWrite, Output int64
}

// Sum is the four prices together (MaxPriceSum bounds it).
func (p ScaledPrice) Sum() int64 { return p.Input + p.CachedInput + p.CacheWrite + p.Output }

// Scaled returns the price in 10^-12 currency per token, defaults applied.
func (p Price) Scaled() (ScaledPrice, error) {
	var s ScaledPrice
	var err error
	if s.Input, err = p.Input.Scaled(PriceScale); err != nil {
		return s, fmt.Errorf("input: %w", err)
	}
	s.CachedInput, s.CacheWrite = s.Input, DefaultCacheWriteFactor*s.Input
	if p.CachedInput != "" {
		if s.CachedInput, err = p.CachedInput.Scaled(PriceScale); err != nil {
			return s, fmt.Errorf("cachedInput: %w", err)
		}
	}
	if p.CacheWrite != "" {
		if s.CacheWrite, err = p.CacheWrite.Scaled(PriceScale); err != nil {
			return s, fmt.Errorf("cacheWrite: %w", err)
		}
	}
	if s.Output, err = p.Output.Scaled(PriceScale); err != nil {
		return s, fmt.Errorf("output: %w", err)
	}
	return s, nil
}

// costs checks what the costs of the budgets rest on: the price table and
// one token type.
func (v *validator) costs() {
	if pr := v.s.Spec.Pricing; pr != nil {
		v.pricing(pr)
	}
	v.tokenType()
}

func (v *validator) pricing(pr *Pricing) {
	const p = "spec.pricing"
	if !currencyRE.MatchString(pr.Currency) {
		v.fail(p+".currency", "must be an ISO 4217 code of three capital letters (USD, EUR), got %q", pr.Currency)
	}
	if len(pr.Models) == 0 {
		v.fail(p+".models", "at least one model price is required")
	}
	for i, m := range pr.Models {
		mp := fmt.Sprintf("%s.models[%d]", p, i)
		if m.Model == "" {
			v.fail(mp+".model", "is required")
		} else if _, err := regexp.Compile(m.Model); err != nil {
			v.fail(mp+".model", "invalid regular expression: %v", err)
		} else if strings.ContainsAny(m.Model, "\x00\n") {
			v.fail(mp+".model", "must not contain NUL or newlines")
		}
		v.price(mp, m.Price)
	}
	if pr.Default == nil {
		v.fail(p+".default", "is required: a request for a model no entry matches would otherwise cost nothing")
	} else {
		v.price(p+".default", *pr.Default)
	}
}

func (v *validator) price(p string, pr Price) {
	for _, f := range []struct {
		name     string
		a        Amount
		required bool
	}{{"input", pr.Input, true}, {"cachedInput", pr.CachedInput, false}, {"cacheWrite", pr.CacheWrite, false}, {"output", pr.Output, true}} {
		if f.a == "" {
			if f.required {
				v.fail(p+"."+f.name, "is required (price per million tokens)")
			}
			continue
		}
		n, err := f.a.Scaled(PriceScale)
		switch {
		case err != nil:
			v.fail(p+"."+f.name, "%v (prices per million tokens keep at most 6 decimal places)", err)
		case n > MaxPrice*PriceScale:
			v.fail(p+"."+f.name, "must be at most %d per million tokens", MaxPrice)
		}
	}
	if s, err := pr.Scaled(); err == nil && s.Sum() > MaxPriceSum*PriceScale {
		v.fail(p, "input, cachedInput, cacheWrite (default %dx input) and output add up to more than %d per million tokens: the cost expression could overflow for the largest token counts", DefaultCacheWriteFactor, MaxPriceSum)
	}
}

// TokenType is the Envoy AI Gateway LLMRequestCost type the spec's token
// caps count: the type of its rendered GatewayConfigs (validation makes them
// agree), else TotalToken, what AI Gateway's llm_total_token key and
// agentgateway's own token count hold. Caps past uint32 charge the same type
// in thousands (render's kilotoken expression), so every cap of a budget
// counts the same tokens.
func (s *BudgetSet) TokenType() string {
	for _, g := range s.Spec.Gateways {
		if g.GatewayConfig != nil && g.GatewayConfig.Type != "" {
			return g.GatewayConfig.Type
		}
	}
	return DefaultGatewayConfigType
}

// tokenType checks that every Gateway counts the same tokens: the rendered
// GatewayConfigs agree on one type, and a type other than TotalToken is
// rendered for every Gateway (a Gateway without one counts what its routes
// say, and agentgateway always counts total tokens).
func (v *validator) tokenType() {
	want, first := "", -1
	for i, g := range v.s.Spec.Gateways {
		if g.GatewayConfig == nil || g.GatewayConfig.Type == "" {
			continue
		}
		if first < 0 {
			want, first = g.GatewayConfig.Type, i
			continue
		}
		if g.GatewayConfig.Type != want {
			v.fail(fmt.Sprintf("spec.gateways[%d].gatewayConfig.type", i), "%s, but spec.gateways[%d] counts %s: a budget's caps would count different tokens on each Gateway; use one type", g.GatewayConfig.Type, first, want)
		}
	}
	if first < 0 || want == DefaultGatewayConfigType {
		return
	}
	for i, g := range v.s.Spec.Gateways {
		switch {
		case g.Kind == GatewayAgentgateway:
			v.fail(fmt.Sprintf("spec.gateways[%d]", i), "agentgateway counts total tokens, but spec.gateways[%d].gatewayConfig.type is %s: a budget would count different tokens on each Gateway", first, want)
		case g.GatewayConfig == nil:
			v.fail(fmt.Sprintf("spec.gateways[%d]", i), "needs gatewayConfig (type %s, as spec.gateways[%d]): without it the Gateway counts what its routes' llmRequestCosts say, and a budget's caps could count different tokens", want, first)
		}
	}
}
