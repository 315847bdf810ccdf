package report

import (
	"fmt"
	"strconv"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// RuleInfo ties a ledger rule to its budget and says what its usage counts.
type RuleInfo struct {
	Budget string
	Kind   string // budgetmap.KindTokens or KindKillSwitch
	// Principal is set for an override's own rule: the rule's bucket is that
	// one principal.
	Principal string
	// Measure is MeasureTokens or MeasureCost; Scale multiplies the ledger's
	// units into the measure's (1000 for a kilotoken rule, else 1).
	Measure string
	Scale   uint64
}

// CapKey names one cap of a budget: its window and measure.
type CapKey struct {
	Period  ledger.Period
	Measure string
}

// CapInfo is one cap as the spec says it.
type CapInfo struct {
	// Cap is in tokens, or in 1/10,000 of Currency for a money cap.
	Cap      uint64
	Currency string
}

// BudgetInfo is what the spec says about a budget.
type BudgetInfo struct {
	Mode string
	// ShadowSince is the spec's shadowSince (YYYY-MM-DD), "" when unknown.
	ShadowSince string
	// Group budgets (group, frontier) have one shared bucket: their
	// principal is the group.
	Group bool
	// Reserve is the spec's reserve ("" when the budget does not reserve).
	Reserve string
	// Caps are the default rule's caps, Overrides each override principal's.
	Caps      map[CapKey]CapInfo
	Overrides map[string]map[CapKey]CapInfo
}

// Mapping is the rule-to-budget map (from the spec via render). Rules it
// does not name are still reported: a budget map's bucket rows (domain
// "budget") by the budget their bucket names, others each on its own.
type Mapping struct {
	Rules   map[ledger.RuleID]RuleInfo
	Budgets map[string]BudgetInfo
}

// Rule resolves a ledger rule: by the mapping, else by a budget map
// bucket's name; ok is false for a rule neither names (it is reported on
// its own, counting tokens).
func (m Mapping) Rule(r ledger.RuleID) (RuleInfo, bool) {
	if info, ok := m.Rules[r]; ok {
		return info, true
	}
	if r.Domain == ledger.BudgetDomain {
		if _, budget, _, measure, ok := budgetmap.ParseBucket(r.Rule); ok {
			return bucketRule(budget, measure), true
		}
	}
	return RuleInfo{Budget: "rule " + r.Rule, Kind: budgetmap.KindTokens, Measure: MeasureTokens, Scale: 1}, false
}

// BucketSet is the budget set a budget map bucket names ("" for a name that
// is not a bucket).
func BucketSet(bucket string) string {
	set, _, _, _, ok := budgetmap.ParseBucket(bucket)
	if !ok {
		return ""
	}
	return set
}

// bucketRule is what a bucket's name says of its rows.
func bucketRule(budget, measure string) RuleInfo {
	info := RuleInfo{Budget: budget, Kind: budgetmap.KindTokens, Measure: MeasureTokens, Scale: 1}
	switch measure {
	case budgetmap.MeasureCost:
		info.Measure = MeasureCost
	case budgetmap.MeasureKiloTokens:
		info.Scale = spec.TokenUnit
	case budgetmap.KindKillSwitch:
		info.Kind = budgetmap.KindKillSwitch
	}
	return info
}

// MappingFromSpec renders bs and reads each BackendTrafficPolicy's
// rule-budgets annotation, so the ledger's rules (Envoy Gateway's domain
// <ns>/<policy> and rule <ns>/<policy>/rule/<i>, or a budget map's buckets)
// map to budgets exactly as the deployed policies number them, with the caps
// of every window and measure from the spec.
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
		m.Budgets[ref.Name] = budgetInfo(bs, ref)
	}
	addBuckets(&m, bs)
	return m, nil
}

// budgetInfo is the spec's view of one budget.
func budgetInfo(bs *spec.BudgetSet, ref spec.Ref) BudgetInfo {
	bi := BudgetInfo{Mode: string(ref.Rollout.Mode), ShadowSince: ref.Rollout.ShadowSince, Group: ref.Kind == spec.KindGroup || ref.Kind == spec.KindFrontier}
	var ls []spec.Limit
	if ref.Budget != nil {
		bi.Reserve = reserveOf(ref.Budget.Reservation)
		ls = ref.Budget.AllLimits()
		for _, o := range ref.Budget.Overrides {
			if bi.Overrides == nil {
				bi.Overrides = map[string]map[CapKey]CapInfo{}
			}
			bi.Overrides[o.Principal] = capsOf(bs, o.AllLimits())
		}
	} else if ref.Frontier != nil {
		bi.Reserve = reserveOf(ref.Frontier.Reservation)
		ls = ref.Frontier.AllLimits()
	}
	bi.Caps = capsOf(bs, ls)
	return bi
}

// reserveOf is a reservation as the report names it: "auto", a number of
// tokens, or "" for none.
func reserveOf(r spec.Reservation) string {
	switch {
	case !r.On():
		return ""
	case r.Reserve.Auto():
		return spec.ReserveAuto
	}
	return strconv.FormatInt(r.Reserve.Tokens(), 10)
}

// CapsOf returns the caps of a set of limits, keyed by window and measure.
func capsOf(bs *spec.BudgetSet, ls []spec.Limit) map[CapKey]CapInfo {
	out := map[CapKey]CapInfo{}
	for _, l := range ls {
		p, ok := ledger.ParsePeriod(string(l.Window()))
		if !ok {
			continue
		}
		if l.IsCost() {
			units, err := l.Cost.Scaled(spec.CostScale)
			if err != nil || units < 0 || bs.Spec.Pricing == nil {
				continue // validation refuses it
			}
			out[CapKey{p, MeasureCost}] = CapInfo{Cap: uint64(units), Currency: bs.Spec.Pricing.Currency}
			continue
		}
		out[CapKey{p, MeasureTokens}] = CapInfo{Cap: uint64(max(l.Tokens, 0))}
	}
	return out
}

// SpecCaps are a budget's current caps in the spec, keyed as in
// Cap.Window/Cap.Measure ("day/tokens"), for promote's check that evidence
// was measured against the caps the spec has now.
func SpecCaps(bs *spec.BudgetSet, budget string) (map[string]uint64, error) {
	ref, err := bs.Budget(budget)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for k, c := range budgetInfo(bs, ref).Caps {
		out[k.Period.String()+"/"+k.Measure] = c.Cap
	}
	return out, nil
}

// MappingFromPolicies builds the rule map from rendered policies alone. A
// base policy's own rules come first (spec.gateways[].basePolicy): the
// annotation gives each budget rule's index among all of them.
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
		if n := len(rbs); n > 0 && rbs[n-1].Rule >= len(rules) {
			return Mapping{}, fmt.Errorf("BackendTrafficPolicy %s/%s: %s names rule %d but the policy has %d rules", btp.Namespace, btp.Name, render.AnnotationRuleBudgets, rbs[n-1].Rule, len(rules))
		}
		domain := btp.Namespace + "/" + btp.Name
		for _, rb := range rbs {
			id := ledger.RuleID{Domain: domain, Rule: budgetmap.RuleDescriptor(domain, rb.Rule)}
			info := bucketRule(rb.Budget, rb.Measure)
			if rb.Kind == budgetmap.KindKillSwitch {
				info.Kind = budgetmap.KindKillSwitch
			}
			info.Principal = rb.Principal
			m.Rules[id] = info
		}
	}
	return m, nil
}

// addBuckets maps the ledger rows a service with the budget map records
// (domain "budget", rule = the bucket) to their budgets, so a budget counted
// once across Gateways is reported once; an override's own rule records its
// principal, so the bucket needs no principal here.
//
// Without a budget map, the service names an agentgateway descriptor's rows
// by its domain and its first entry's value, the budget's name (the config
// fixes it: `key: budget, value: <budget>`), so those rows map to the budget
// too; the window of each row tells its cap apart.
func addBuckets(m *Mapping, bs *spec.BudgetSet) {
	for _, e := range render.BudgetMap(bs).Entries {
		_, _, _, measure, ok := budgetmap.ParseBucket(e.Bucket)
		if !ok {
			continue
		}
		info := bucketRule(e.Budget, measure)
		m.Rules[ledger.RuleID{Domain: ledger.BudgetDomain, Rule: e.Bucket}] = info
		if e.Gateway.Kind == budgetmap.GatewayAgentgateway && e.OverridePrincipal == "" && len(e.Descriptor) > 0 {
			m.Rules[ledger.RuleID{Domain: e.Domain, Rule: e.Descriptor[0].Value}] = info
		}
	}
}
