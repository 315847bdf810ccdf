package ledgerpg

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/budgetgen/budgetgen/internal/ledger"
)

var _ ledger.Reader = (*DB)(nil)

// Keys implements ledger.Reader: the rule-windows synced among windows
// (every one when windows is nil).
func (db *DB) Keys(ctx context.Context, windows []ledger.Window) ([]ledger.Key, error) {
	var labels []string
	if windows != nil {
		labels = make([]string, 0, len(windows))
		for _, w := range windows {
			labels = append(labels, w.ID())
		}
	}
	rows, err := db.conn.Query(ctx, `SELECT domain, rule, window_label FROM ledger_windows WHERE $1::text[] IS NULL OR window_label = ANY($1)`, labels)
	if err != nil {
		return nil, fmt.Errorf("list ledger windows: %w", err)
	}
	defer rows.Close()
	var out []ledger.Key
	for rows.Next() {
		var k ledger.Key
		var label string
		if err := rows.Scan(&k.Rule.Domain, &k.Rule.Rule, &label); err != nil {
			return nil, err
		}
		w, ok := ledger.ParseWindowID(label)
		if !ok {
			return nil, fmt.Errorf("ledger_windows holds a malformed window %q", label)
		}
		k.Window = w
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	ledger.SortKeys(out)
	return out, nil
}

// Read implements ledger.Reader: one rule-window's principals (at most
// MaxPrincipals) and totals (denials and reservations).
func (db *DB) Read(ctx context.Context, rule ledger.RuleID, w ledger.Window) (ledger.Data, error) {
	d := ledger.Data{Rule: rule, Window: w, Usage: map[string]uint64{}}
	max := db.MaxPrincipals
	if max <= 0 {
		max = ledger.DefaultMaxPrincipals
	}
	label := w.ID()
	rows, err := db.conn.Query(ctx, `SELECT principal, units, shadow_denials, enforce_denials, reserve_denials
		FROM ledger_usage WHERE domain = $1 AND rule = $2 AND window_label = $3 LIMIT $4`, rule.Domain, rule.Rule, label, max+1)
	if err != nil {
		return d, fmt.Errorf("read %s %s: %w", rule, w, err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var p string
		var units *int64
		var pd [3]int64
		if err := rows.Scan(&p, &units, &pd[0], &pd[1], &pd[2]); err != nil {
			return d, err
		}
		p = fieldOf(p)
		if n++; n > max {
			return d, fmt.Errorf("%w: %s %s has more than %d principals", ledger.ErrTooMany, rule, w, max)
		}
		if units != nil {
			d.Usage[p] = uint64(*units)
		}
		if den := (ledger.Denials{Shadow: uint64(pd[0]), Enforce: uint64(pd[1]), Reserve: uint64(pd[2])}); !den.IsZero() {
			if d.PrincipalDenials == nil {
				d.PrincipalDenials = map[string]ledger.Denials{}
			}
			d.PrincipalDenials[p] = den
		}
	}
	if err := rows.Err(); err != nil {
		return d, err
	}
	var t [6]int64
	err = db.conn.QueryRow(ctx, `SELECT shadow_denials, enforce_denials, reserve_denials, holds, held_units, expired_units FROM ledger_windows
		WHERE domain = $1 AND rule = $2 AND window_label = $3`, rule.Domain, rule.Rule, label).Scan(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5])
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("read totals of %s %s: %w", rule, w, err)
	}
	d.Denials = ledger.Denials{Shadow: uint64(t[0]), Enforce: uint64(t[1]), Reserve: uint64(t[2])}
	d.Holds = ledger.Holds{Count: uint64(t[3]), Held: uint64(t[4]), Expired: uint64(t[5])}
	return d, nil
}
