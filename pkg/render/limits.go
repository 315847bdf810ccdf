package render

import (
	"fmt"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"

	"github.com/budgetgen/budgetgen/pkg/spec"
)

// Measures of a rule's limit in the rule-budgets annotation.
const (
	// MeasureTokens: limit.requests counts tokens (the annotation omits it).
	MeasureTokens = ""
	// MeasureKiloTokens: limit.requests counts units of spec.TokenUnit tokens.
	MeasureKiloTokens = "ktokens"
	// MeasureCost: limit.requests counts 1/spec.CostScale of the pricing currency.
	MeasureCost = "cost"
)

// UnsupportedError is a limit render cannot express, with the reason.
type UnsupportedError struct {
	Object string // the field path
	Reason string
	// File and Line locate Object in the spec file; set by Render for a
	// spec loaded from YAML.
	File string
	Line int
}

func (e *UnsupportedError) Error() string {
	if e.File != "" && e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Object, e.Reason)
	}
	return e.Object + ": " + e.Reason
}

// positioned gives an UnsupportedError the spec's file and the line of its
// field, as validation errors have; other errors are returned as they are.
func positioned(bs *spec.BudgetSet, err error) error {
	if ue, ok := err.(*UnsupportedError); ok && ue.File == "" && bs.File() != "" {
		ue.File, ue.Line = bs.File(), bs.Line(ue.Object)
	}
	if le, ok := err.(*LimitError); ok && le.File == "" && le.Field != "" && bs.File() != "" {
		le.File, le.Line = bs.File(), bs.Line(le.Field)
	}
	return err
}

// gatewayPath is the field path of Gateway gw of bs, by its index.
func gatewayPath(bs *spec.BudgetSet, gw spec.GatewayRef) string {
	for i := range bs.Spec.Gateways {
		if bs.Spec.Gateways[i].ID() == gw.ID() {
			return fmt.Sprintf("spec.gateways[%d]", i)
		}
	}
	return "spec.gateways"
}

// budgetPath is the field path of a budget of bs, by its index.
func budgetPath(bs *spec.BudgetSet, b *spec.Budget) string {
	for i := range bs.Spec.Budgets {
		if &bs.Spec.Budgets[i] == b {
			return fmt.Sprintf("spec.budgets[%d]", i)
		}
	}
	return "spec.budgets[" + b.Name + "]"
}

// overridePath is the field path of b's override of principal (principals
// are unique), by its index: render walks the overrides sorted.
func overridePath(budgetPath string, b *spec.Budget, principal string) string {
	for j := range b.Overrides {
		if b.Overrides[j].Principal == principal {
			return fmt.Sprintf("%s.overrides[%d]", budgetPath, j)
		}
	}
	return budgetPath + ".overrides[" + principal + "]"
}

// charge is what one limit's rule counts: its limit, window and the
// response metadata it charges.
type charge struct {
	requests uint32
	unit     egv1a1.RateLimitUnit
	metadata egv1a1.RateLimitCostMetadata
	measure  string
}

var periodUnits = map[spec.Period]egv1a1.RateLimitUnit{
	spec.PeriodHour: egv1a1.RateLimitUnitHour, spec.PeriodDay: egv1a1.RateLimitUnitDay,
	spec.PeriodWeek: egv1a1.RateLimitUnitWeek, spec.PeriodMonth: egv1a1.RateLimitUnitMonth,
}

// limitCharge turns one validated limit into its rule's charge. Token caps
// within EG's uint32 charge the token source itself; larger ones and money
// charge a key Envoy AI Gateway computes (LLMRequestCosts), which needs the
// AI Gateway's metadata namespace and its total token count.
func limitCharge(bs *spec.BudgetSet, path string, l spec.Limit) (charge, error) {
	unit, ok := periodUnits[l.Window()]
	if !ok {
		return charge{}, &UnsupportedError{Object: path + ".per", Reason: fmt.Sprintf("unknown period %q", l.Per)}
	}
	ts := bs.Spec.TokenSource
	aigw := func(what string) error {
		if ts.Namespace != spec.DefaultTokenMetadataNamespace || ts.Key != spec.DefaultTokenMetadataKey {
			return &UnsupportedError{Object: path, Reason: fmt.Sprintf(
				"%s is charged from a cost Envoy AI Gateway computes (llmRequestCosts in %s), but spec.tokenSource is %s/%s: use the AI Gateway's default token source or lower the cap to at most %d tokens",
				what, spec.DefaultTokenMetadataNamespace, ts.Namespace, ts.Key, int64(spec.MaxTokensPerDay))}
		}
		return nil
	}
	c := charge{unit: unit, metadata: egv1a1.RateLimitCostMetadata{Namespace: ts.Namespace, Key: ts.Key}}
	switch {
	case l.IsCost():
		if err := aigw("a cost limit"); err != nil {
			return charge{}, err
		}
		units, err := l.Cost.Scaled(spec.CostScale)
		if err != nil || units <= 0 || units > spec.MaxTokensPerDay {
			return charge{}, &UnsupportedError{Object: path + ".cost", Reason: fmt.Sprintf("must be within (0, %d] %s", int64(spec.MaxCost), bs.Spec.Pricing.Currency)}
		}
		c.requests, c.measure = uint32(units), MeasureCost
		c.metadata = egv1a1.RateLimitCostMetadata{Namespace: spec.DefaultTokenMetadataNamespace, Key: CostMetadataKey}
	case l.Tokens <= 0 || l.Tokens > spec.MaxTokens:
		return charge{}, &UnsupportedError{Object: path + ".tokens", Reason: fmt.Sprintf("must be within [1, %d]", int64(spec.MaxTokens))}
	case l.Tokens > spec.MaxTokensPerDay:
		if err := aigw(fmt.Sprintf("a cap above %d tokens", int64(spec.MaxTokensPerDay))); err != nil {
			return charge{}, err
		}
		if l.Tokens%spec.TokenUnit != 0 {
			return charge{}, &UnsupportedError{Object: path + ".tokens", Reason: fmt.Sprintf("caps above %d tokens count units of %d: write a multiple of %d", int64(spec.MaxTokensPerDay), spec.TokenUnit, spec.TokenUnit)}
		}
		c.requests, c.measure = uint32(l.Tokens/spec.TokenUnit), MeasureKiloTokens
		c.metadata = egv1a1.RateLimitCostMetadata{Namespace: spec.DefaultTokenMetadataNamespace, Key: KiloTokenMetadataKey}
	default:
		c.requests = uint32(l.Tokens)
	}
	return c, nil
}

// windowName is the annotation's window: omitted for a day, the shorthand's.
func windowName(l spec.Limit) string {
	if l.Window() == spec.PeriodDay {
		return ""
	}
	return string(l.Window())
}
