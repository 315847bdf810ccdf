package ledger

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// DefaultMaxPrincipals bounds how many principals one rule-window may hold
// when read back; past it the read fails rather than exhausting memory.
const DefaultMaxPrincipals = 2_000_000

// ErrTooMany is wrapped when a read would exceed its bound.
var ErrTooMany = errors.New("ledger: too many entries")

// Denials are counts of over-limit answers: would-be 429s (Shadow), real
// ones (Enforce), and of either, those due to reservations alone (Reserve).
type Denials struct {
	Shadow, Enforce, Reserve uint64
}

// IsZero reports whether there are none.
func (d Denials) IsZero() bool { return d == Denials{} }

// Add adds o to d.
func (d *Denials) Add(o Denials) {
	d.Shadow += o.Shadow
	d.Enforce += o.Enforce
	d.Reserve += o.Reserve
}

// Holds are a window's reservations: checks admitted holding a reservation
// (Count), the units they held (Held: the sum of their reserve) and the units
// of holds that expired before their request's charge came (Expired).
// Amounts are in the rule's units, like usage.
type Holds struct {
	Count, Held, Expired uint64
}

// IsZero reports whether there are none.
func (h Holds) IsZero() bool { return h == Holds{} }

// Add adds o to h.
func (h *Holds) Add(o Holds) {
	h.Count += o.Count
	h.Held += o.Held
	h.Expired += o.Expired
}

// Data is one rule's measurements for one window.
type Data struct {
	Rule   RuleID
	Window Window
	// Usage maps encoded principals (EncodePrincipal) to usage.
	Usage map[string]uint64
	// Denials are the window's totals.
	Denials Denials
	// PrincipalDenials are each principal's (encoded) denials. A recorder
	// past its bound keeps the totals only, so they may add up to less.
	PrincipalDenials map[string]Denials
	// Holds are the window's reservations (totals only).
	Holds Holds
}

// Empty reports whether d holds nothing.
func (d *Data) Empty() bool {
	return len(d.Usage) == 0 && d.Denials.IsZero() && len(d.PrincipalDenials) == 0 && d.Holds.IsZero()
}

// Key names one rule-window with data.
type Key struct {
	Rule   RuleID
	Window Window
}

// Reader reads the ledger back.
type Reader interface {
	// Keys lists the rule-windows with any data among windows (every one
	// when windows is nil), sorted by rule then window. Past the reader's
	// bound it may return the keys found so far with an error wrapping
	// ErrTooMany (Valkey.Keys does).
	Keys(ctx context.Context, windows []Window) ([]Key, error)
	// Read returns one rule's data for one window (empty when there is none).
	Read(ctx context.Context, rule RuleID, w Window) (Data, error)
}

// ReadAll reads every rule-window with data among windows (all of them when
// windows is nil), sorted by rule then window.
func ReadAll(ctx context.Context, r Reader, windows []Window) ([]Data, error) {
	keys, err := r.Keys(ctx, windows)
	if err != nil {
		return nil, err
	}
	var out []Data
	for _, k := range keys {
		d, err := r.Read(ctx, k.Rule, k.Window)
		if err != nil {
			return nil, fmt.Errorf("read ledger %s %s: %w", k.Rule, k.Window, err)
		}
		if !d.Empty() {
			out = append(out, d)
		}
	}
	return out, nil
}

// windowSet is a filter of windows; nil keeps every window.
type windowSet map[Window]bool

func newWindowSet(ws []Window) windowSet {
	if ws == nil {
		return nil
	}
	s := windowSet{}
	for _, w := range ws {
		s[w] = true
	}
	return s
}

func (s windowSet) has(w Window) bool { return s == nil || s[w] }

// SortKeys sorts keys by rule, then window (period, then start), as every
// Reader returns them.
func SortKeys(keys []Key) {
	sort.Slice(keys, func(i, j int) bool { return keyLess(keys[i], keys[j]) })
}

// sortKeys sorts and deduplicates keys.
func sortKeys(m map[Key]bool) []Key {
	out := make([]Key, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return keyLess(out[i], out[j]) })
	return out
}

func keyLess(a, b Key) bool {
	if a.Rule != b.Rule {
		if a.Rule.Domain != b.Rule.Domain {
			return a.Rule.Domain < b.Rule.Domain
		}
		return a.Rule.Rule < b.Rule.Rule
	}
	if a.Window.Period != b.Window.Period {
		return a.Window.Period < b.Window.Period
	}
	if a.Window.Day != b.Window.Day {
		return a.Window.Day < b.Window.Day
	}
	return a.Window.Hour < b.Window.Hour
}

// addStatsField adds n to the denial or reservation count a stats field
// names; unknown fields are ignored (a newer writer's).
func addStatsField(d *Data, f string, n uint64) {
	switch f {
	case FieldHolds:
		d.Holds.Count += n
		return
	case FieldHeldUnits:
		d.Holds.Held += n
		return
	case FieldExpiredUnits:
		d.Holds.Expired += n
		return
	case FieldShadowDenials:
		d.Denials.Shadow += n
		return
	case FieldEnforceDenials:
		d.Denials.Enforce += n
		return
	case FieldReserveDenials:
		d.Denials.Reserve += n
		return
	}
	kind, p, ok := strings.Cut(f, ":")
	if !ok || len(kind) != 1 {
		return
	}
	if d.PrincipalDenials == nil {
		d.PrincipalDenials = map[string]Denials{}
	}
	pd := d.PrincipalDenials[p]
	switch kind {
	case "s":
		pd.Shadow += n
	case "e":
		pd.Enforce += n
	case "r":
		pd.Reserve += n
	default:
		return
	}
	d.PrincipalDenials[p] = pd
}
