package report

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// MappingFromSpec renders bs and reads each BackendTrafficPolicy's rule-budgets
// annotation, so the ledger's rules (Envoy Gateway's domain <ns>/<policy> and
// rule <ns>/<policy>/rule/<i>) map to budget names and caps exactly as the
// deployed policies number them.
func MappingFromSpec(bs *spec.BudgetSet) (Mapping, error) {
	res, err := render.Render(bs)
	if err != nil {
		return Mapping{}, fmt.Errorf("render spec for the rule map: %w", err)
	}
	var btps []*egv1a1.BackendTrafficPolicy
	for _, o := range res.Objects {
		if btp, ok := o.Object.(*egv1a1.BackendTrafficPolicy); ok {
			btps = append(btps, btp)
		}
	}
	m, err := MappingFromPolicies(btps)
	if err != nil {
		return Mapping{}, err
	}
	for _, ref := range bs.Refs() {
		bi := BudgetInfo{Mode: string(ref.Rollout.Mode), Cap: uint64(ref.TokensPerDay), Group: ref.Kind == spec.KindGroup || ref.Kind == spec.KindFrontier}
		bi.Unmeasured = unmeasured(ref)
		if ref.Budget != nil && len(ref.Budget.Overrides) > 0 {
			bi.Overrides = map[string]uint64{}
			for _, o := range ref.Budget.Overrides {
				bi.Overrides[o.Principal] = uint64(spec.DailyTokens(o.AllLimits()))
			}
		}
		m.Budgets[ref.Name] = bi
	}
	addBuckets(&m, bs)
	return m, nil
}

// MappingFromPolicies builds the rule map from rendered policies alone (caps
// from each rule's limit; no modes or overrides beyond the override rules).
func MappingFromPolicies(btps []*egv1a1.BackendTrafficPolicy) (Mapping, error) {
	m := Mapping{Rules: map[ledger.RuleID]RuleInfo{}, Budgets: map[string]BudgetInfo{}}
	for _, btp := range btps {
		rbs, err := render.RuleBudgets(btp.Annotations)
		if err != nil {
			return Mapping{}, fmt.Errorf("BackendTrafficPolicy %s/%s: %w", btp.Namespace, btp.Name, err)
		}
		var rules []egv1a1.RateLimitRule
		if btp.Spec.RateLimit != nil && btp.Spec.RateLimit.Global != nil {
			rules = btp.Spec.RateLimit.Global.Rules
		}
		// A base policy's own rules come first (spec.gateways[].basePolicy):
		// the annotation gives each budget rule's index among all of them.
		if n := len(rbs); n > 0 && rbs[n-1].Rule >= len(rules) {
			return Mapping{}, fmt.Errorf("BackendTrafficPolicy %s/%s: %s names rule %d but the policy has %d rules", btp.Namespace, btp.Name, render.AnnotationRuleBudgets, rbs[n-1].Rule, len(rules))
		}
		domain := btp.Namespace + "/" + btp.Name
		for _, rb := range rbs {
			i := rb.Rule
			id := ledger.RuleID{Domain: domain, Rule: domain + "/rule/" + strconv.Itoa(i)}
			// A money or kilotoken rule is measured in other units than the
			// budget's token rules: report it as a budget of its own.
			switch rb.Measure {
			case render.MeasureCost:
				rb.Budget += " (" + rb.Currency + ")"
				if rb.Principal == "" && rb.Window == "" {
					m.Budgets[rb.Budget] = BudgetInfo{Cap: uint64(rules[i].Limit.Requests), Currency: rb.Currency}
				}
			case render.MeasureKiloTokens:
				rb.Budget += " (1000 tokens)"
			}
			kind := KindTokens
			if rb.Kind == render.RuleKindKillSwitch {
				kind = KindKillSwitch
			}
			m.Rules[id] = RuleInfo{Budget: rb.Budget, Kind: kind, Principal: rb.Principal, Cap: uint64(rules[i].Limit.Requests)}
			// The budget's cap is its daily token rule's (the ledger measures day windows).
			if _, ok := m.Budgets[rb.Budget]; !ok && rb.Principal == "" && kind == KindTokens && rb.Window == "" && rb.Measure == render.MeasureTokens {
				m.Budgets[rb.Budget] = BudgetInfo{Cap: uint64(rules[i].Limit.Requests)}
			}
		}
	}
	return m, nil
}

// unmeasured says why a budget has no measurements when none of its caps is
// per day: the ledger records the usage of day-window rules only, so the
// caps of a budget with hour, week or month windows alone are enforced but
// never reported. "" when the budget has a day cap.
func unmeasured(ref spec.Ref) string {
	var ls []spec.Limit
	switch {
	case ref.Budget != nil:
		ls = ref.Budget.AllLimits()
	case ref.Frontier != nil:
		ls = ref.Frontier.AllLimits()
	}
	var windows []string
	for _, l := range ls {
		if l.Window() == spec.PeriodDay {
			return ""
		}
		if w := string(l.Window()); !slices.Contains(windows, w) {
			windows = append(windows, w)
		}
	}
	if len(windows) == 0 {
		return ""
	}
	return fmt.Sprintf("not measured: the shadow-week ledger measures day caps, and %s has caps per %s only (enforced, never reported); add a day cap to measure it", ref.Name, strings.Join(windows, " and "))
}
