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

// MaxPrice is the largest price per million tokens (currency units): with
// it, a request's cost in 10^-12 currency stays within a uint64 in the CEL
// expression whatever its uint32 token counts.
const MaxPrice = 1000

var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

// Pricing is the price table that turns a request's token counts into money,
// for cost limits. Envoy AI Gateway computes the cost per request with a CEL
// expression budgetgen renders from it (docs/spec.md, "Money").
type Pricing struct {
	// Currency is an ISO 4217 code. Default USD. Every cost limit is in it.
	Currency string `json:"currency,omitempty" jsonschema:"pattern=^[A-Z]{3}$"`
	// Models are matched in order against the request's model name (RE2,
	// full match); the first match prices the request.
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
	// CachedInput is the price per million cached input tokens; default Input.
	CachedInput Amount `json:"cachedInput,omitempty"`
	// Output is the price per million output tokens.
	Output Amount `json:"output"`
}

// Scaled returns the price's input, cached input and output prices in
// 10^-12 currency per token (= PriceScale units per million tokens).
func (p Price) Scaled() (input, cached, output int64, err error) {
	if input, err = p.Input.Scaled(PriceScale); err != nil {
		return 0, 0, 0, fmt.Errorf("input: %w", err)
	}
	cached = input
	if p.CachedInput != "" {
		if cached, err = p.CachedInput.Scaled(PriceScale); err != nil {
			return 0, 0, 0, fmt.Errorf("cachedInput: %w", err)
		}
	}
	if output, err = p.Output.Scaled(PriceScale); err != nil {
		return 0, 0, 0, fmt.Errorf("output: %w", err)
	}
	return input, cached, output, nil
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
	}{{"input", pr.Input, true}, {"cachedInput", pr.CachedInput, false}, {"output", pr.Output, true}} {
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
}
