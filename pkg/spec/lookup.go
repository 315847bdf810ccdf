package spec

import (
	"fmt"
	"slices"
	"sort"
)

// Ref is a budget addressed by name: one of spec.budgets, or the frontier cap
// under the name "frontier". Rollout points into the BudgetSet, so promote can
// edit the mode in place.
type Ref struct {
	Name string
	Kind BudgetKind
	// Path is the field path of the budget in the spec ("spec.budgets[2]" or
	// "spec.frontier"), for errors and YAML node edits.
	Path string
	// Budget is set for per-principal and group budgets, Frontier for the frontier cap.
	Budget   *Budget
	Frontier *Frontier
	Rollout  *Rollout
	// TokensPerDay is the default daily token cap (per principal for
	// perPrincipal budgets): tokensPerDay, or the limit of tokens per day; 0
	// when the budget has none (only other windows or money).
	TokensPerDay int64
}

// Budget finds a budget by name ("frontier" is the frontier cap). The error
// lists the known names when there is no such budget.
func (s *BudgetSet) Budget(name string) (Ref, error) {
	for _, r := range s.Refs() {
		if r.Name == name {
			return r, nil
		}
	}
	return Ref{}, fmt.Errorf("no budget named %q (known: %v)", name, s.Names())
}

// Refs lists every addressable budget in spec order, the frontier cap last.
func (s *BudgetSet) Refs() []Ref {
	refs := make([]Ref, 0, len(s.Spec.Budgets)+1)
	for i := range s.Spec.Budgets {
		b := &s.Spec.Budgets[i]
		refs = append(refs, Ref{
			Name: b.Name, Kind: b.Kind(), Path: fmt.Sprintf("spec.budgets[%d]", i),
			Budget: b, Rollout: &b.Rollout, TokensPerDay: DailyTokens(b.AllLimits()),
		})
	}
	if f := s.Spec.Frontier; f != nil {
		refs = append(refs, Ref{
			Name: FrontierName, Kind: KindFrontier, Path: "spec.frontier",
			Frontier: f, Rollout: &f.Rollout, TokensPerDay: DailyTokens(f.AllLimits()),
		})
	}
	return refs
}

// Names lists the addressable budget names in spec order, "frontier" last.
func (s *BudgetSet) Names() []string {
	refs := s.Refs()
	names := make([]string, len(refs))
	for i, r := range refs {
		names[i] = r.Name
	}
	return names
}

// CapFor is the daily cap of one principal under a budget: its override when
// it has one, else the budget's cap.
func (r Ref) CapFor(principal string) int64 {
	if r.Budget != nil {
		for _, o := range r.Budget.Overrides {
			if o.Principal == principal {
				return DailyTokens(o.AllLimits())
			}
		}
	}
	return r.TokensPerDay
}

// IdentityHeaders lists the declared identity headers, sorted.
func (s *BudgetSet) IdentityHeaders() []string {
	return sortedKeys(s.Spec.Identities)
}

// SortedOverrides returns b's overrides sorted by principal (the order render uses).
func (b *Budget) SortedOverrides() []Override {
	out := slices.Clone(b.Overrides)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Principal < out[j].Principal })
	return out
}
