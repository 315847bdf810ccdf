package metrics

import (
	"strings"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
)

// RuleLabels are the labels of the per-rule series, in order.
var RuleLabels = []string{"domain", "rule", "budget", "window", "mode", "gateway"}

// BudgetLabels are the labels of the per-budget series, in order.
var BudgetLabels = []string{"budget", "window", "mode", "gateway"}

// Modes, the mode label's values.
const (
	ModeShadow  = "shadow"
	ModeEnforce = "enforce"
)

// OverrideRule is the rule label of a request-supplied limit override (one
// series per domain, whatever the request asked).
const OverrideRule = "override"

// BudgetKey is what the budget map says of a rule: the labels of the
// per-budget series. Its values come from the config, never from requests.
type BudgetKey struct {
	Budget, Window, Mode, Gateway string
}

func (b BudgetKey) values() []string { return []string{b.Budget, b.Window, b.Mode, b.Gateway} }

// RuleKey is the label values of one rule's series. A rule the budget map
// names has its budget's labels and an empty rule (so the same budget's
// override rules, whose config paths hold a principal's name, share its
// series); any other rule has a readable rule name, its window (the
// config's unit) and mode, and no budget or gateway.
type RuleKey struct {
	Domain, Rule string
	BudgetKey
}

func (l RuleKey) values() []string {
	return []string{l.Domain, l.Rule, l.Budget, l.Window, l.Mode, l.Gateway}
}

// KeyOf returns the labels of a limit's series.
func KeyOf(l *config.RateLimit) RuleKey {
	if b := l.Budget; b != nil {
		return RuleKey{Domain: l.Domain, BudgetKey: BudgetKeyOf(b)}
	}
	mode := ModeEnforce
	if l.ShadowMode {
		mode = ModeShadow
	}
	k := RuleKey{Domain: l.Domain, Rule: ReadableRule(l), BudgetKey: BudgetKey{Window: strings.ToLower(l.Unit.String()), Mode: mode}}
	if l.Unit == config.Unit(0) { // UNKNOWN: an unlimited rule
		k.Window = ""
	}
	return k
}

// BudgetKeyOf returns the per-budget labels of a budget.
func BudgetKeyOf(b *config.Budget) BudgetKey {
	return BudgetKey{Budget: b.Name, Window: b.Window, Mode: b.Mode, Gateway: b.Gateway}
}

// ReadableRule names a limit that no budget names, for the rule label: its
// rate_limit name when the config gives one, "override" for a request's
// limit override, else its config path without the domain, one level per
// ".", a level "key" when its value is empty or repeats the key (Envoy
// Gateway's "<ns>/<policy>/rule/<i>" levels), "key=value" otherwise, and the
// domain's "<domain>/" prefix dropped from keys (Envoy Gateway's generic keys
// start with it): "rule/0.rule-0-match-0" instead of
// "ns/policy.ns/policy/rule/0_ns/policy/rule/0.rule-0-match-0".
func ReadableRule(l *config.RateLimit) string {
	if l.Name != "" {
		return l.Name
	}
	if l.Path == nil {
		return OverrideRule
	}
	var b strings.Builder
	for i, e := range l.Path {
		if i > 0 {
			b.WriteByte('.')
		}
		k := strings.TrimPrefix(e.Key, l.Domain+"/")
		b.WriteString(k)
		if e.Value != "" && e.Value != e.Key {
			b.WriteByte('=')
			b.WriteString(e.Value)
		}
	}
	return b.String()
}
