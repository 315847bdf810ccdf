package render

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/budgetgen/budgetgen/internal/aigateway"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// Metadata keys budgetgen asks Envoy AI Gateway to write (namespace
// io.envoy.ai_gateway, like every llmRequestCosts key) and its rules charge.
const (
	// KiloTokenMetadataKey holds a response's tokens in units of
	// spec.TokenUnit, rounded up: what caps above 4,294,967,295 tokens charge.
	// It counts the spec's token type (spec.BudgetSet.TokenType: total tokens
	// unless the rendered GatewayConfigs say otherwise), so the large caps of a
	// budget count the same tokens as its other caps.
	KiloTokenMetadataKey = "budgetgen_total_ktokens"
	// CostMetadataKey holds a request's cost in 1/spec.CostScale of the
	// pricing currency, rounded up: what cost limits charge.
	CostMetadataKey = "budgetgen_cost"
	// AnnotationLLMRequestCosts on a BackendTrafficPolicy lists, as JSON, the
	// llmRequestCosts entries its rules need the AI Gateway to compute.
	AnnotationLLMRequestCosts = "budgetgen.dev/llm-request-costs"
	// CostTypeCEL is the LLMRequestCost type of a CEL expression.
	CostTypeCEL = "CEL"
)

// KiloTokenExpression is the CEL cost of KiloTokenMetadataKey for a token
// type (an LLMRequestCost type, spec.BudgetSet.TokenType): that count divided
// by 1,000, rounded up, so a request is never charged less than it used (at
// most 999 tokens more).
func KiloTokenExpression(tokenType string) (string, error) {
	v, ok := aigateway.CostVariable[tokenType]
	if !ok {
		return "", fmt.Errorf("token type %q has no CEL variable", tokenType)
	}
	return fmt.Sprintf("(%s + %du) / %du", v, spec.TokenUnit-1, spec.TokenUnit), nil
}

// CostEntry is one Envoy AI Gateway LLMRequestCost
// (AIGatewayRoute.spec.llmRequestCosts[] or
// GatewayConfig.spec.globalLLMRequestCosts[]): the filter evaluates CEL in the
// environment of internal/aigateway (AI Gateway v1.1.0's
// internal/llmcostcel/cel.go) and writes the unsigned result as dynamic
// metadata.
type CostEntry struct {
	MetadataKey string `json:"metadataKey"`
	Type        string `json:"type"`
	CEL         string `json:"cel,omitempty"`
}

// LLMRequestCosts are the entries the BudgetSet's rules need, sorted by key:
// none for a spec of token caps within uint32.
func LLMRequestCosts(bs *spec.BudgetSet) ([]CostEntry, error) {
	var kilo, cost bool
	for _, ls := range allLimits(bs) {
		for _, l := range ls {
			switch {
			case l.IsCost():
				cost = true
			case l.Tokens > spec.MaxTokensPerDay:
				kilo = true
			}
		}
	}
	var out []CostEntry
	if cost {
		expr, err := CostExpression(bs.Spec.Pricing)
		if err != nil {
			return nil, err
		}
		if err := checkCEL(bs, "spec.pricing.models", expr); err != nil {
			return nil, err
		}
		out = append(out, CostEntry{MetadataKey: CostMetadataKey, Type: CostTypeCEL, CEL: expr})
	}
	if kilo {
		expr, err := KiloTokenExpression(bs.TokenType())
		if err != nil {
			return nil, err
		}
		out = append(out, CostEntry{MetadataKey: KiloTokenMetadataKey, Type: CostTypeCEL, CEL: expr})
	}
	return out, nil
}

// checkCEL compiles a rendered cost expression the way Envoy AI Gateway's
// controller does (internal/aigateway): past its parser's limits (a
// recursion depth of 250, which a chain of about 244 spec.pricing.models
// entries reaches, or 100,000 characters) AI Gateway would reject the whole
// GatewayConfig or route, so render fails first, naming the spec's line.
func checkCEL(bs *spec.BudgetSet, path, expr string) error {
	if _, err := aigateway.NewCostProgram(expr); err != nil {
		n := 0
		if p := bs.Spec.Pricing; p != nil {
			n = len(p.Models)
		}
		return bs.Errorf(path,
			"the cost expression rendered from %d model prices (%d characters) is refused by Envoy AI Gateway's CEL compiler: %v; merge models into fewer entries with one regular expression each (gpt-5|gpt-5-2026.*)",
			n, len(expr), err)
	}
	return nil
}

// allLimits lists every limit list of the spec: budgets, overrides, frontier.
func allLimits(bs *spec.BudgetSet) [][]spec.Limit {
	var out [][]spec.Limit
	for i := range bs.Spec.Budgets {
		b := &bs.Spec.Budgets[i]
		out = append(out, b.AllLimits())
		for j := range b.Overrides {
			out = append(out, b.Overrides[j].AllLimits())
		}
	}
	if f := bs.Spec.Frontier; f != nil {
		out = append(out, f.AllLimits())
	}
	return out
}

// picoPerUnit is how many 10^-12 currency one cost unit (1/CostScale) holds.
const picoPerUnit = 1_000_000_000_000 / spec.CostScale

// CostExpression is the CEL expression computing a request's cost in
// 1/spec.CostScale of the currency from the AI Gateway's token counts and
// model name: the first spec.pricing.models entry whose regex fully matches
// the model prices it, else spec.pricing.default. Each term is exact in
// 10^-12 currency per token (prices keep 6 decimals per million tokens); the
// sum is rounded up to a whole unit, so the error is below one unit
// (0.0001 of the currency) per request and never in the caller's favour.
// AI Gateway's input_tokens counts cache reads and cache writes too (OpenAI's
// prompt_tokens; its Anthropic translator adds cache_read_input_tokens and
// cache_creation_input_tokens to input_tokens, internal/translator/
// anthropic_helper.go), so uncached input is what remains after both, and
// cache writes are priced at their own (higher) price.
func CostExpression(p *spec.Pricing) (string, error) {
	if p == nil {
		return "", fmt.Errorf("spec.pricing: required by cost limits")
	}
	if p.Default == nil {
		return "", fmt.Errorf("spec.pricing.default: required: a model no entry matches would cost nothing")
	}
	def, err := priceTerm(*p.Default)
	if err != nil {
		return "", fmt.Errorf("spec.pricing.default: %w", err)
	}
	var b strings.Builder
	for i, m := range p.Models {
		t, err := priceTerm(m.Price)
		if err != nil {
			return "", fmt.Errorf("spec.pricing.models[%d]: %w", i, err)
		}
		// CEL's matches() is an unanchored RE2 search: anchor for a full match.
		fmt.Fprintf(&b, "model.matches(%s) ? %s : ", strconv.Quote("^(?:"+m.Model+")$"), t)
	}
	b.WriteString(def)
	return fmt.Sprintf("((%s) + %du) / %du", b.String(), picoPerUnit-1, picoPerUnit), nil
}

// priceTerm is one price's cost in 10^-12 currency, as CEL over uints. Cache
// reads and writes are charged at their own prices even when a gateway
// reports more of them than input tokens (never too little), and the uncached
// remainder never underflows.
func priceTerm(p spec.Price) (string, error) {
	sp, err := p.Scaled()
	if err != nil {
		return "", err
	}
	const uncached = "(input_tokens > cached_input_tokens + cache_creation_input_tokens ? input_tokens - cached_input_tokens - cache_creation_input_tokens : 0u)"
	return fmt.Sprintf("(%s * %du + cached_input_tokens * %du + cache_creation_input_tokens * %du + output_tokens * %du)",
		uncached, sp.Input, sp.CachedInput, sp.CacheWrite, sp.Output), nil
}
