package ledger

import (
	"context"
	"errors"
	"fmt"
	"sort"
)

// DefaultMaxPrincipals bounds how many principals one rule-day may hold when
// read back; past it the read fails rather than exhausting memory.
const DefaultMaxPrincipals = 2_000_000

// ErrTooMany is wrapped when a read would exceed its bound.
var ErrTooMany = errors.New("ledger: too many entries")

// DayData is one rule's measurements for one UTC day.
type DayData struct {
	Rule RuleID
	Day  Day
	// Usage maps encoded principals (EncodePrincipal) to tokens.
	Usage map[string]uint64
	// ShadowDenials are would-be 429s; EnforceDenials real ones.
	ShadowDenials  uint64
	EnforceDenials uint64
}

// Reader reads the ledger back.
type Reader interface {
	// Rules lists the rules with any data on one of days, sorted.
	Rules(ctx context.Context, days []Day) ([]RuleID, error)
	// Read returns one rule's data for one day (empty when there is none).
	Read(ctx context.Context, rule RuleID, day Day) (DayData, error)
}

// ReadAll reads every rule with data on days, sorted by rule then day.
func ReadAll(ctx context.Context, r Reader, days []Day) ([]DayData, error) {
	rules, err := r.Rules(ctx, days)
	if err != nil {
		return nil, err
	}
	var out []DayData
	for _, rule := range rules {
		for _, d := range days {
			dd, err := r.Read(ctx, rule, d)
			if err != nil {
				return nil, fmt.Errorf("read ledger %s %s: %w", rule, d, err)
			}
			if len(dd.Usage) > 0 || dd.ShadowDenials > 0 || dd.EnforceDenials > 0 {
				out = append(out, dd)
			}
		}
	}
	return out, nil
}

func sortRules(m map[RuleID]bool) []RuleID {
	out := make([]RuleID, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Domain != out[j].Domain {
			return out[i].Domain < out[j].Domain
		}
		return out[i].Rule < out[j].Rule
	})
	return out
}
