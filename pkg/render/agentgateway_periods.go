package render

import (
	"fmt"
	"math"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/budgetgen/budgetgen/pkg/spec"
)

// AgwEntryWindow is the descriptor entry that tells a budget's windows apart
// when it has several: a CEL string literal (hour, day, week or month), so
// the server config holds one subtree per window, each with its own unit.
// A budget with one window has no such entry (its descriptor is budget, then
// principal or group), so adding or removing a window is the only change
// that moves a budget's descriptors.
const AgwEntryWindow = "window"

// agwPeriods is the order windows are rendered in, shortest first.
var agwPeriods = []spec.Period{spec.PeriodHour, spec.PeriodDay, spec.PeriodWeek, spec.PeriodMonth}

// agwUnits maps a window to its unit in the rate limit config. The service
// counts WEEK and MONTH as calendar windows by default (docs/windows.md),
// the same as the Envoy Gateway rules of the same budget.
var agwUnits = map[spec.Period]rlsconfv3.RateLimitUnit{
	spec.PeriodHour: rlsconfv3.RateLimitUnit_HOUR, spec.PeriodDay: rlsconfv3.RateLimitUnit_DAY,
	spec.PeriodWeek: rlsconfv3.RateLimitUnit_WEEK, spec.PeriodMonth: rlsconfv3.RateLimitUnit_MONTH,
}

// agwPlan is what one budget on an agentgateway Gateway renders to: its
// windows, the default cap in each (0: none in that window) and each
// override's (0: none; an override replaces the budget's caps for its
// principal, as on Envoy Gateway, so the default's cap in a window the
// override lacks does not apply to it).
type agwPlan struct {
	budget    *spec.Budget
	windows   []spec.Period
	caps      map[spec.Period]int64
	overrides []agwOverride
}

type agwOverride struct {
	principal string
	caps      map[spec.Period]int64
}

// multi reports whether the budget's descriptors carry a window entry.
func (p *agwPlan) multi() bool { return len(p.windows) > 1 }

// agentgatewayCaps checks the caps of one budget or override on agentgateway:
// token limits of an hour, day, week or month, each within the config's
// uint32. Anything else is refused with the reason rather than rendered as
// a wrong cap (a missing cap would read as 0, which denies every request once
// enforced): money and caps past uint32 are charged on Envoy Gateway from a
// cost Envoy AI Gateway computes into response metadata, and agentgateway
// charges its own token count (docs/agentgateway.md).
func agentgatewayCaps(path string, limits []spec.Limit) (map[spec.Period]int64, error) {
	if len(limits) == 0 {
		return nil, &UnsupportedError{Object: path, Reason: "no token cap: a budget on an agentgateway Gateway needs tokensPerDay or limits (token caps within 1..4294967295)"}
	}
	caps := map[spec.Period]int64{}
	for i, l := range limits {
		lp := fmt.Sprintf("%s.limits[%d]", path, i)
		if l.IsCost() {
			return nil, &UnsupportedError{Object: lp, Reason: "a money limit is charged from the cost Envoy AI Gateway computes; agentgateway charges its own token count, so place money budgets on Envoy Gateway Gateways"}
		}
		w := l.Window()
		if _, ok := agwUnits[w]; !ok {
			return nil, &UnsupportedError{Object: lp + ".per", Reason: fmt.Sprintf("unknown period %q", l.Per)}
		}
		if l.Tokens < 1 || l.Tokens > math.MaxUint32 {
			return nil, &UnsupportedError{Object: lp, Reason: fmt.Sprintf("token cap %d per %s is not within 1..4294967295 for agentgateway (larger caps count units of 1,000 tokens, which only Envoy AI Gateway computes)", l.Tokens, w)}
		}
		if _, dup := caps[w]; dup {
			return nil, &UnsupportedError{Object: lp, Reason: fmt.Sprintf("a second token cap per %s", w)}
		}
		caps[w] = l.Tokens
	}
	return caps, nil
}

// planAgentgateway checks and plans one budget on an agentgateway Gateway.
func planAgentgateway(path string, b *spec.Budget) (*agwPlan, error) {
	caps, err := agentgatewayCaps(path, b.AllLimits())
	if err != nil {
		return nil, err
	}
	p := &agwPlan{budget: b, caps: caps}
	seen := map[spec.Period]bool{}
	for w := range caps {
		seen[w] = true
	}
	for _, o := range b.SortedOverrides() {
		oc, err := agentgatewayCaps(overridePath(path, b, o.Principal), o.AllLimits())
		if err != nil {
			return nil, err
		}
		for w := range oc {
			seen[w] = true
		}
		p.overrides = append(p.overrides, agwOverride{principal: o.Principal, caps: oc})
	}
	for _, w := range agwPeriods {
		if seen[w] {
			p.windows = append(p.windows, w)
		}
	}
	return p, nil
}

// agwLeaf is one limit of a budget's config subtree: the descriptor path
// below the budget entry, and its cap (0 with unlimited: an override's
// exemption from a default cap in a window of its own it lacks).
type agwLeaf struct {
	window    spec.Period
	key       string
	value     string
	tokens    int64
	unlimited bool
	override  string // the override's principal, for the budget map
}

// leaves lists the plan's limits, window by window in period order, the
// default before the overrides (sorted by principal).
func (p *agwPlan) leaves() []agwLeaf {
	var out []agwLeaf
	for _, w := range p.windows {
		if p.budget.Kind() == spec.KindGroup {
			out = append(out, agwLeaf{window: w, key: AgwEntryGroup, value: p.budget.Group.Equals, tokens: p.caps[w]})
			continue
		}
		def := p.caps[w]
		if def > 0 {
			out = append(out, agwLeaf{window: w, key: AgwEntryPrincipal, tokens: def})
		}
		for _, o := range p.overrides {
			switch c := o.caps[w]; {
			case c > 0:
				out = append(out, agwLeaf{window: w, key: AgwEntryPrincipal, value: o.principal, tokens: c, override: o.principal})
			case def > 0:
				// key_value wins over key: without this the default's cap
				// in this window would count the override's principal.
				out = append(out, agwLeaf{window: w, key: AgwEntryPrincipal, value: o.principal, unlimited: true, override: o.principal})
			}
		}
	}
	return out
}

// agentgatewayPlans plans every budget placed on gw, in spec order.
func agentgatewayPlans(bs *spec.BudgetSet, gw spec.GatewayRef) ([]*agwPlan, error) {
	var out []*agwPlan
	for _, b := range agentgatewayBudgets(bs, gw) {
		p, err := planAgentgateway(budgetPath(bs, b), b)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}
