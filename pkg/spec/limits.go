package spec

import (
	"fmt"
	"math/big"
	"strings"
)

// Period is the window of a limit. Windows are the rate limit service's
// calendar windows (UTC by default: a day from 00:00, an ISO week from Monday
// 00:00, a month from the 1st 00:00; see docs/windows.md).
type Period string

// Periods of a limit.
const (
	PeriodHour  Period = "hour"
	PeriodDay   Period = "day"
	PeriodWeek  Period = "week"
	PeriodMonth Period = "month"
)

// Periods lists the periods in increasing length.
var Periods = []Period{PeriodHour, PeriodDay, PeriodWeek, PeriodMonth}

// MaxTokens is the largest token cap of one window budgetgen can render:
// above MaxTokensPerDay (EG's uint32 limit.requests) a cap is charged in
// units of TokenUnit tokens, so the limit in units must fit a uint32 again.
const MaxTokens = MaxTokensPerDay * TokenUnit

// TokenUnit is how many tokens one unit of a large token cap counts (see
// docs/spec.md, "Caps past 4,294,967,295 tokens").
const TokenUnit = 1000

// CostScale is how many minor units one unit of the pricing currency holds:
// money is counted in 1/10,000 of the currency (a hundredth of a cent), so
// a monthly cap in units fits EG's uint32 up to 429,496.7295 (currency), and a
// request's cost, rounded up, is at most 0.0001 too high.
const CostScale = 10_000

// MaxCost is the largest money cap of one window, in currency units.
const MaxCost = MaxTokensPerDay / CostScale

// Limit is one window's cap of a budget, override or the frontier cap.
// Exactly one of Tokens and Cost is set.
type Limit struct {
	// Tokens is the cap in tokens per window, 1 .. 4294967295000 (past
	// 4294967295 it is charged in units of 1,000 tokens and must be a
	// multiple of 1,000).
	Tokens int64 `json:"tokens,omitempty" jsonschema:"minimum=1,maximum=4294967295000"`
	// Cost is a money cap per window in spec.pricing.currency, a decimal with
	// at most 4 decimal places (e.g. 500 or 12.5). Needs spec.pricing.
	Cost Amount `json:"cost,omitempty"`
	// Per is the window: hour, day (default), week or month.
	Per Period `json:"per,omitempty" jsonschema:"enum=hour,enum=day,enum=week,enum=month"`
}

// Amount is a non-negative decimal written as a YAML number or string
// ("500", "0.075"); kept as text so no float rounding ever touches money.
type Amount string

// Scaled returns a*scale as an integer, or an error when a is not a
// non-negative decimal or has more precision than scale keeps.
func (a Amount) Scaled(scale int64) (int64, error) {
	s := strings.TrimSpace(string(a))
	if s == "" || strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") || strings.ContainsAny(s, "eE_xX") {
		return 0, fmt.Errorf("must be a non-negative decimal number, got %q", string(a))
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return 0, fmt.Errorf("must be a non-negative decimal number, got %q", string(a))
	}
	r.Mul(r, new(big.Rat).SetInt64(scale))
	if !r.IsInt() {
		return 0, fmt.Errorf("%q has more decimal places than 1/%d", string(a), scale)
	}
	if !r.Num().IsInt64() {
		return 0, fmt.Errorf("%q is too large", string(a))
	}
	return r.Num().Int64(), nil
}

// IsCost reports whether the limit caps money.
func (l Limit) IsCost() bool { return l.Cost != "" }

// Window is the limit's period, day when unset.
func (l Limit) Window() Period {
	if l.Per == "" {
		return PeriodDay
	}
	return l.Per
}

// limitsOf is the one place the tokensPerDay shorthand expands: a cap of n
// tokens per day.
func limitsOf(tokensPerDay int64, limits []Limit) []Limit {
	if len(limits) > 0 {
		return limits
	}
	if tokensPerDay > 0 {
		return []Limit{{Tokens: tokensPerDay, Per: PeriodDay}}
	}
	return nil
}

// AllLimits are the budget's windows: limits, or tokensPerDay as one daily limit.
func (b *Budget) AllLimits() []Limit { return limitsOf(b.TokensPerDay, b.Limits) }

// AllLimits are the override's windows: limits, or tokensPerDay as one daily limit.
func (o *Override) AllLimits() []Limit { return limitsOf(o.TokensPerDay, o.Limits) }

// AllLimits are the frontier cap's windows: limits, or tokensPerDay as one daily limit.
func (f *Frontier) AllLimits() []Limit { return limitsOf(f.TokensPerDay, f.Limits) }

// DailyTokens is the daily token cap of a set of limits, 0 when none is a
// daily token limit (reports and promote measure daily token budgets).
func DailyTokens(ls []Limit) int64 {
	for _, l := range ls {
		if !l.IsCost() && l.Window() == PeriodDay {
			return l.Tokens
		}
	}
	return 0
}

// limits validates the cap of a budget, override or frontier: tokensPerDay
// or limits, not both, not neither.
func (v *validator) limits(p string, tokensPerDay int64, ls []Limit) {
	switch {
	case tokensPerDay != 0 && len(ls) > 0:
		v.fail(p+".limits", "set either tokensPerDay or limits, not both (tokensPerDay: N is limits: [{tokens: N, per: day}])")
		return
	case len(ls) == 0: // tokensPerDay, the one-window shorthand (0 when absent)
		v.cap(p+".tokensPerDay", tokensPerDay)
		return
	}
	seen := map[string]int{}
	for i, l := range ls {
		lp := fmt.Sprintf("%s.limits[%d]", p, i)
		switch l.Window() {
		case PeriodHour, PeriodDay, PeriodWeek, PeriodMonth:
		default:
			v.fail(lp+".per", "unknown period %q: must be hour, day, week or month", l.Per)
		}
		kind := "tokens"
		switch {
		case l.Tokens != 0 && l.IsCost():
			v.fail(lp, "set either tokens or cost, not both (one rule each: write two limits)")
		case l.IsCost():
			kind = "cost"
			units, err := l.Cost.Scaled(CostScale)
			switch {
			case err != nil:
				v.fail(lp+".cost", "%v", err)
			case units <= 0:
				v.fail(lp+".cost", "must be > 0")
			case units > MaxTokensPerDay:
				v.fail(lp+".cost", "must be at most %d (Envoy Gateway's limit.requests is a uint32 counting 1/%d of the currency)", int64(MaxCost), CostScale)
			}
			if v.s.Spec.Pricing == nil {
				v.fail(lp+".cost", "a cost limit needs spec.pricing (the price of each model per million tokens)")
			}
		case l.Tokens <= 0:
			v.fail(lp+".tokens", "must be > 0 (use frontier.killSwitch to stop traffic)")
		case l.Tokens > MaxTokens:
			v.fail(lp+".tokens", "must be at most %d (4294967295 units of %d tokens; Envoy Gateway's limit.requests is a uint32)", int64(MaxTokens), TokenUnit)
		case l.Tokens > MaxTokensPerDay && l.Tokens%TokenUnit != 0:
			v.fail(lp+".tokens", "caps above %d are charged in units of %d tokens: write a multiple of %d (e.g. %d)", int64(MaxTokensPerDay), TokenUnit, TokenUnit, l.Tokens/TokenUnit*TokenUnit)
		}
		k := kind + "/" + string(l.Window())
		if first, dup := seen[k]; dup {
			v.fail(lp, "a second %s limit per %s (first at limits[%d]): the smaller one always binds first, keep one", kind, l.Window(), first)
		} else {
			seen[k] = i
		}
	}
}
