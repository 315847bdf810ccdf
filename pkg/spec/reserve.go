package spec

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/invopop/jsonschema"
)

// ReserveAuto is the reserve that is learned from a budget's own charges.
const ReserveAuto = "auto"

// Reservation makes a budget bind under concurrency: every admitted,
// unfinished request holds budget until its tokens are charged, so a fan-out
// of concurrent requests cannot all pass a check that sees only what was
// already charged (docs/spec.md, "Reservations"; docs/security.md gives the
// overshoot bound).
type Reservation struct {
	// Reserve is the tokens held for each admitted, unfinished request: an
	// integer, or auto (the 95th percentile of the budget's recent charges,
	// learned by the rate limit service; ReserveInitial until it has seen
	// 20). A request is admitted while used + held < cap; its charge adds
	// its real count and releases the hold; a hold whose charge never comes
	// expires (RESERVATION_EXPIRY, 10 minutes). Missing: no reservation. A
	// cost limit holds the reserve's tokens at the dearest price of
	// spec.pricing.
	Reserve Reserve `json:"reserve,omitempty"`
	// ReserveInitial is what reserve: auto holds until the budget has seen
	// enough charges. Required with auto.
	ReserveInitial int64 `json:"reserveInitial,omitempty" jsonschema:"minimum=1,maximum=4294967295000"`
}

// Reserve is a reservation size: a positive integer (tokens) or "auto". It
// is kept as the YAML scalar's text and checked by Validate.
type Reserve string

// JSONSchema makes the schema say what Validate accepts.
func (Reserve) JSONSchema() *jsonschema.Schema {
	return &jsonschema.Schema{OneOf: []*jsonschema.Schema{
		{Type: "integer", Minimum: "1", Maximum: "4294967295000"},
		{Type: "string", Enum: []any{ReserveAuto}},
	}}
}

// Auto reports whether the reserve is learned.
func (r Reserve) Auto() bool { return strings.TrimSpace(string(r)) == ReserveAuto }

// Tokens returns a fixed reserve's tokens (0 for none or auto).
func (r Reserve) Tokens() int64 {
	n, err := strconv.ParseInt(strings.ReplaceAll(strings.TrimSpace(string(r)), "_", ""), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// On reports whether the rollout reserves at all.
func (r Reservation) On() bool { return r.Reserve != "" }

// reservation validates a budget's or the frontier's reservation.
func (v *validator) reservation(p string, r Reservation) {
	switch {
	case r.Reserve == "":
		if r.ReserveInitial != 0 {
			v.fail(p+".reserveInitial", "is only for reserve: auto")
		}
		return
	case r.Reserve.Auto():
		if r.ReserveInitial <= 0 {
			v.fail(p+".reserve", "auto needs reserveInitial, the tokens held for each request until the budget has seen enough charges to learn from")
		}
		if r.ReserveInitial > MaxTokens {
			v.fail(p+".reserveInitial", "must be at most %d", int64(MaxTokens))
		}
	default:
		n := r.Reserve.Tokens()
		if n <= 0 || n > MaxTokens {
			v.fail(p+".reserve", "must be auto or a number of tokens from 1 to %d, got %q", int64(MaxTokens), string(r.Reserve))
			return // not a fixed reserve either: reserveInitial may be right
		}
		if r.ReserveInitial != 0 {
			v.fail(p+".reserveInitial", "is only for reserve: auto (this reserve is fixed: %s)", string(r.Reserve))
		}
	}
}

// ReserveUnits converts a reserve of tokens into the units a rule counts:
// tokens, thousands of tokens (rounded up), or 1/CostScale of the pricing
// currency at the dearest price of the table (rounded up: a hold never
// covers less than the tokens it stands for).
func (s *BudgetSet) ReserveUnits(tokens int64, kiloTokens, cost bool) (int64, error) {
	switch {
	case tokens <= 0:
		return 0, nil
	case kiloTokens:
		return (tokens + TokenUnit - 1) / TokenUnit, nil
	case !cost:
		return tokens, nil
	}
	p := s.Spec.Pricing
	if p == nil {
		return 0, fmt.Errorf("a cost limit's reserve needs spec.pricing")
	}
	var dearest int64 // 10^-12 currency per token
	prices := []Price{}
	for _, m := range p.Models {
		prices = append(prices, m.Price)
	}
	if p.Default != nil {
		prices = append(prices, *p.Default)
	}
	for _, pr := range prices {
		sp, err := pr.Scaled()
		if err != nil {
			return 0, err
		}
		dearest = max(dearest, sp.Input, sp.CachedInput, sp.CacheWrite, sp.Output)
	}
	// tokens * dearest 10^-12 currency, in units of 1/CostScale currency,
	// rounded up (in big integers: the product passes int64).
	perUnit := big.NewInt(1_000_000_000_000 / CostScale)
	n := new(big.Int).Mul(big.NewInt(tokens), big.NewInt(dearest))
	n.Add(n, new(big.Int).Sub(perUnit, big.NewInt(1)))
	n.Quo(n, perUnit)
	if !n.IsInt64() || n.Int64() > MaxTokensPerDay {
		return MaxTokensPerDay, nil // more than any cost cap: the first admitted request holds the whole window
	}
	return max(n.Int64(), 1), nil
}
