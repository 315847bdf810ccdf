package render

import (
	"encoding/json"
	"fmt"

	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// RuleBudget says which budget one rule of a BackendTrafficPolicy implements.
// The annotation budgetgen.dev/rule-budgets holds the list, in rule order, so
// a rate limit descriptor (rule <i>) can be traced back to its budget.
type RuleBudget struct {
	// Rule is the index in spec.rateLimit.global.rules.
	Rule int `json:"rule"`
	// Budget is the budget name ("frontier" for the frontier cap).
	Budget string `json:"budget"`
	// Kind is budgetmap.KindTokens (a token budget rule, charged from
	// response metadata) or budgetmap.KindKillSwitch (the frontier kill
	// switch: a request count, requests: 0).
	Kind string `json:"kind"`
	// Principal is set on an override's own rule only.
	Principal string `json:"principal,omitempty"`
	// Window is the rule's period when it is not a day (hour, week, month).
	Window string `json:"window,omitempty"`
	// Measure is what limit.requests counts when not tokens: MeasureKiloTokens
	// or MeasureCost.
	Measure string `json:"measure,omitempty"`
	// Currency is the pricing currency of a MeasureCost rule, whose
	// limit.requests counts 1/spec.CostScale of it.
	Currency string `json:"currency,omitempty"`
}

// RuleBudgets parses the budgetgen.dev/rule-budgets annotation from an
// object's annotations. It fails when the annotation is missing or malformed,
// or when its rule indices are not increasing (they start after a base
// policy's own rules, spec.gateways[].basePolicy).
func RuleBudgets(annotations map[string]string) ([]RuleBudget, error) {
	raw, ok := annotations[AnnotationRuleBudgets]
	if !ok {
		return nil, fmt.Errorf("annotation %s is missing", AnnotationRuleBudgets)
	}
	var rbs []RuleBudget
	if err := json.Unmarshal([]byte(raw), &rbs); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationRuleBudgets, err)
	}
	for i, rb := range rbs {
		if rb.Rule < 0 || i > 0 && rb.Rule <= rbs[i-1].Rule {
			return nil, fmt.Errorf("annotation %s: entry %d has rule %d, want an index above the previous entry's", AnnotationRuleBudgets, i, rb.Rule)
		}
		if rb.Budget == "" {
			return nil, fmt.Errorf("annotation %s: entry %d has no budget", AnnotationRuleBudgets, i)
		}
		if rb.Kind != budgetmap.KindTokens && rb.Kind != budgetmap.KindKillSwitch {
			return nil, fmt.Errorf("annotation %s: entry %d has unknown kind %q", AnnotationRuleBudgets, i, rb.Kind)
		}
	}
	return rbs, nil
}
