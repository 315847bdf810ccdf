package render

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/budgetgen/budgetgen/pkg/spec"
)

// Metadata keys budgetgen asks Envoy AI Gateway to write (namespace
// io.envoy.ai_gateway, like every llmRequestCosts key) and its rules charge.
const (
	// KiloTokenMetadataKey holds a response's total tokens in units of
	// spec.TokenUnit, rounded up: what caps above 4,294,967,295 tokens charge.
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

// KiloTokenExpression is the CEL cost of KiloTokenMetadataKey: total tokens
// divided by 1,000, rounded up, so a request is never charged less than it used
// (at most 999 tokens more).
var KiloTokenExpression = fmt.Sprintf("(total_tokens + %du) / %du", spec.TokenUnit-1, spec.TokenUnit)

// CostEntry is one Envoy AI Gateway LLMRequestCost
// (AIGatewayRoute.spec.llmRequestCosts[] or
// GatewayConfig.spec.globalLLMRequestCosts[]): the filter evaluates CEL with
// the variables model, backend, input_tokens, cached_input_tokens,
// cached_write_input_tokens, output_tokens and total_tokens (uints but the
// names) and writes the unsigned result as dynamic metadata.
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
		out = append(out, CostEntry{MetadataKey: CostMetadataKey, Type: CostTypeCEL, CEL: expr})
	}
	if kilo {
		out = append(out, CostEntry{MetadataKey: KiloTokenMetadataKey, Type: CostTypeCEL, CEL: KiloTokenExpression})
	}
	return out, nil
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
// input_tokens counts cached tokens too (OpenAI's prompt_tokens, which the AI
// Gateway reports for every provider), so uncached input is the difference.
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

// priceTerm is one price's cost in 10^-12 currency, as CEL over uints.
func priceTerm(p spec.Price) (string, error) {
	in, cached, out, err := p.Scaled()
	if err != nil {
		return "", err
	}
	const uncached = "(input_tokens > cached_input_tokens ? input_tokens - cached_input_tokens : 0u)"
	const cachedIn = "(input_tokens > cached_input_tokens ? cached_input_tokens : input_tokens)"
	return fmt.Sprintf("(%s * %du + %s * %du + output_tokens * %du)", uncached, in, cachedIn, cached, out), nil
}
