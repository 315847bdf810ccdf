package render

import (
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// BudgetMap lists, for every rule rendered from bs on every Gateway, which
// budget it implements and the bucket its counters belong to: the same data
// as the rule-budgets annotation, plus the domain and descriptor the rate
// limit service sees, so the service can count a budget's principal once
// across Gateways. Entries are sorted; the map is a pure function of bs.
func BudgetMap(bs *spec.BudgetSet) *budgetmap.Map {
	m := &budgetmap.Map{APIVersion: budgetmap.APIVersion, Kind: budgetmap.Kind, BudgetSet: bs.Metadata.Name}
	for _, gw := range bs.Spec.Gateways {
		gref := budgetmap.Gateway{Kind: string(gw.Kind), Namespace: gw.Namespace, Name: gw.Name}
		if gref.Kind == "" {
			gref.Kind = budgetmap.GatewayEnvoy
		}
		if gw.IsAgentgateway() {
			m.Entries = append(m.Entries, agentgatewayEntries(bs, gw, gref)...)
			continue
		}
		// The deployed policy names the domain and numbers the rules: with a
		// basePolicy it is the base's own policy, its rules first.
		btp, err := backendTrafficPolicy(bs, gw)
		if err != nil {
			continue // Render reports it; a map is only written after a render succeeded
		}
		index, err := RuleBudgets(btp.Annotations)
		if err != nil {
			continue
		}
		domain := btp.Namespace + "/" + btp.Name
		ruleList := btp.Spec.RateLimit.Global.Rules
		for _, rb := range index {
			id := budgetmap.RuleDescriptor(domain, rb.Rule)
			e := budgetmap.Entry{
				Domain:            domain,
				Descriptor:        []budgetmap.DescriptorEntry{{Key: id, Value: id}},
				Gateway:           gref,
				Budget:            rb.Budget,
				Kind:              budgetmap.KindTokens,
				OverridePrincipal: rb.Principal,
				Window:            budgetmap.WindowDay,
			}
			if rb.Window != "" {
				e.Window = rb.Window
			}
			bucket := spec.BucketShared
			var res spec.Reservation
			if rb.Budget == spec.FrontierName {
				f := bs.Spec.Frontier
				bucket, e.TokensPerDay, e.Mode, res = f.Bucket, f.TokensPerDay, string(f.Mode), f.Reservation
				if rb.Kind == budgetmap.KindKillSwitch {
					e.Kind, e.TokensPerDay, e.Mode, res = budgetmap.KindKillSwitch, 0, budgetmap.ModeEnforce, spec.Reservation{}
				}
			} else if ref, err := bs.Budget(rb.Budget); err == nil && ref.Budget != nil {
				b := ref.Budget
				bucket, e.Mode, res = b.Bucket, string(b.Mode), b.Reservation
				// The rule's own cap: its window's limit (an override's included).
				e.TokensPerDay = int64(ruleList[rb.Rule].Limit.Requests)
				if b.Kind() == spec.KindPerPrincipal {
					e.Principal.Header = b.PerPrincipal
				}
			}
			if e.Kind == budgetmap.KindTokens {
				e.TokensPerDay = int64(ruleList[rb.Rule].Limit.Requests)
				e.Measure = rb.Measure
				e.Reserve = reserveOf(bs, res, rb.Measure)
			}
			e.Bucket = bucketName(bs, rb.Budget, bucket, gw)
			switch {
			case e.Kind == budgetmap.KindKillSwitch:
				e.Bucket = budgetmap.MeasureBucket(e.Bucket, budgetmap.KindKillSwitch)
			case rb.Measure != MeasureTokens:
				// A money or kilotoken rule counts other units than the
				// budget's token rules, maybe in the same window: its own
				// counters (and ledger rows) keep them apart.
				e.Bucket = budgetmap.MeasureBucket(e.Bucket, rb.Measure)
			}
			m.Entries = append(m.Entries, e)
		}
	}
	m.Sort()
	return m
}

// reserveOf is a rule's reservation in the unit its limit counts (the
// spec's tokens, thousands of tokens, or money at the dearest price); nil
// when the budget does not reserve.
func reserveOf(bs *spec.BudgetSet, r spec.Reservation, measure string) *budgetmap.Reserve {
	if !r.On() {
		return nil
	}
	kilo, cost := measure == MeasureKiloTokens, measure == MeasureCost
	if r.Reserve.Auto() {
		initial, err := bs.ReserveUnits(r.ReserveInitial, kilo, cost)
		if err != nil {
			return nil // validation requires spec.pricing for cost limits
		}
		return &budgetmap.Reserve{Auto: true, Initial: initial}
	}
	n, err := bs.ReserveUnits(r.Reserve.Tokens(), kilo, cost)
	if err != nil {
		return nil
	}
	return &budgetmap.Reserve{Tokens: n}
}

func bucketName(bs *spec.BudgetSet, budget string, bucket spec.Bucket, gw spec.GatewayRef) string {
	if bucket == spec.BucketPerGateway {
		return budgetmap.BucketName(bs.Metadata.Name, budget, gw.ID())
	}
	return budgetmap.BucketName(bs.Metadata.Name, budget, "")
}

func agentgatewayEntries(bs *spec.BudgetSet, gw spec.GatewayRef, gref budgetmap.Gateway) []budgetmap.Entry {
	plans, err := agentgatewayPlans(bs, gw)
	if err != nil {
		return nil // Render reports it; a map is only written after a render succeeded
	}
	domain := AgentgatewayDomain(bs, gw)
	var out []budgetmap.Entry
	for _, p := range plans {
		b := p.budget
		base := budgetmap.Entry{
			Domain: domain, Gateway: gref, Budget: b.Name, Bucket: bucketName(bs, b.Name, b.Bucket, gw),
			Kind: budgetmap.KindTokens, Mode: string(b.Mode),
		}
		if b.Kind() == spec.KindPerPrincipal {
			base.Principal.Expression = ClaimExpression(bs.Spec.Identities[b.PerPrincipal].JWTClaim)
		}
		for _, l := range p.leaves() {
			if l.unlimited {
				continue // counts nothing
			}
			e := base
			e.Descriptor = []budgetmap.DescriptorEntry{{Key: AgwEntryBudget, Value: b.Name}}
			if p.multi() {
				e.Descriptor = append(e.Descriptor, budgetmap.DescriptorEntry{Key: AgwEntryWindow, Value: string(l.window)})
			}
			e.Descriptor = append(e.Descriptor, budgetmap.DescriptorEntry{Key: l.key, Value: l.value})
			e.OverridePrincipal, e.TokensPerDay, e.Window = l.override, l.tokens, string(l.window)
			e.Reserve = reserveOf(bs, b.Reservation, MeasureTokens)
			out = append(out, e)
		}
	}
	return out
}

// RuleCountFor is how many rate limit rules the policy of an Envoy Gateway
// Gateway holds: the rules of the budgets placed on it (one per window, every
// override its own, and per window of a per-principal budget the rule for
// requests without an identity header), the frontier cap and its kill switch.
// 0 for agentgateway.
func RuleCountFor(bs *spec.BudgetSet, gw spec.GatewayRef) int {
	if gw.IsAgentgateway() {
		return 0
	}
	_, index, err := rules(bs, gw)
	if err != nil {
		return RuleCount(bs) // the upper bound; render reports the error itself
	}
	return len(index)
}
