package ledgerpg

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// Measures as stored (the measure column).
const (
	MeasureTokens     = "tokens"
	MeasureKiloTokens = "ktokens"
	MeasureCost       = "cost"
)

// Names says which budget a ledger rule's rows belong to and what its units
// count.
type Names struct {
	BudgetSet, Budget, Gateway string
	// Measure is MeasureTokens, MeasureKiloTokens or MeasureCost.
	Measure string
	// Guessed: the namer did not know the rule (BucketNames' fallback: the
	// rule is its own budget, counting tokens). Guessed names are given to
	// new rows only; rows an earlier sync named keep their names, so a sync
	// without the spec does not turn a money budget's units into tokens.
	Guessed bool
}

// Namer names a ledger rule.
type Namer func(r ledger.RuleID) Names

// BucketNames names a budget map's bucket rows by their bucket
// (<set>/<budget>[@<gateway>][#<measure>]); any other rule (a service run
// without a budget map) is its own budget, counting tokens.
func BucketNames(r ledger.RuleID) Names {
	if r.Domain == ledger.BudgetDomain {
		if set, budget, gw, m, ok := budgetmap.ParseBucket(r.Rule); ok {
			n := Names{BudgetSet: set, Budget: budget, Gateway: gw, Measure: MeasureTokens}
			if m == budgetmap.MeasureCost || m == budgetmap.MeasureKiloTokens {
				n.Measure = m
			}
			return n
		}
	}
	return Names{Budget: r.Rule, Measure: MeasureTokens, Guessed: true}
}

// SyncOptions for Sync. The zero value copies every window the source
// holds, names rules with BucketNames and dates windows in UTC.
type SyncOptions struct {
	// Location is the zone of the service's windows (RESET_TIME_ZONE):
	// window_start and window_end are their instants in it. Default UTC.
	Location *time.Location
	// Names names the rules; default BucketNames.
	Names Namer
	// Windows restricts the copy to these windows; nil copies every window
	// the source still holds (closed and running).
	Windows []ledger.Window
	// Now stamps synced_at; default time.Now.
	Now func() time.Time
	// Source names the ledger copied from (ledger_syncs.source); "" keeps
	// no record and checks no gap.
	Source string
	// RetentionDays is how long the source keeps a window after it ends
	// (the service's LEDGER_RETENTION_DAYS): a previous sync older than it
	// is a gap (ErrGap). Default ledger.DefaultRetentionDays.
	RetentionDays int
}

// SyncStats says what a sync did.
type SyncStats struct {
	// Windows is the rule-windows read; Rows the principal rows written.
	Windows, Rows int
	// Changed counts the rows inserted or changed (0 when nothing was new).
	Changed int64
	// Skipped names the rule-windows left out because they hold more
	// principals than the reader's bound (ledger.ErrTooMany).
	Skipped []string
	// Previous is when the previous sync from Source committed (its clock,
	// SyncOptions.Now); zero for the first.
	Previous time.Time
}

// ErrSkipped is wrapped by Sync's error when it copied everything but the
// rule-windows in SyncStats.Skipped: those were refused by the reader's
// bound, the rest is committed.
var ErrSkipped = errors.New("rule-windows over the principal bound were not copied")

// ErrKeysTruncated is wrapped by Sync's error when listing the ledger's
// rule-windows stopped at the reader's key bound (ledger.ErrTooMany from
// Keys, with the keys found until then): those are committed, the
// rule-windows of the keys the scan did not reach are not.
var ErrKeysTruncated = errors.New("the ledger holds more keys than the scan's bound: the rule-windows of the keys past it were not copied")

// Sync copies src (the service's ledger in Valkey, or its debug port's) into
// the database in one transaction: nothing is half-copied. A rule-window over
// the reader's principal bound is left out whole and named in the error
// (ErrSkipped) while the others commit: one oversized window must not stop
// every budget's hourly copy until the ledger's retention has lost them.
// Likewise a ledger with more keys than the reader lists (ledger.ErrTooMany
// from Keys) copies the rule-windows listed and returns ErrKeysTruncated.
// With o.Source, the sync records its time, and when the previous one is
// older than the retention it still commits and returns ErrGap.
func (db *DB) Sync(ctx context.Context, src ledger.Reader, o SyncOptions) (SyncStats, error) {
	if o.Location == nil {
		o.Location = time.UTC
	}
	if o.Names == nil {
		o.Names = BucketNames
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.RetentionDays == 0 {
		o.RetentionDays = ledger.DefaultRetentionDays
	}
	var st SyncStats
	// A listing cut at the reader's bound still copies the keys it found: a
	// reader that found none (or failed otherwise) stops the sync.
	keys, truncated := src.Keys(ctx, o.Windows)
	if truncated != nil && (len(keys) == 0 || !errors.Is(truncated, ledger.ErrTooMany)) {
		return st, fmt.Errorf("list the ledger: %w", truncated)
	}
	now := o.Now().UTC()
	err := pgx.BeginFunc(ctx, db.conn, func(tx pgx.Tx) error {
		prev, err := recordSync(ctx, tx, o.Source, now)
		if err != nil {
			return err
		}
		st.Previous = prev
		return copyWindows(ctx, tx, src, keys, &o, now, &st)
	})
	if err != nil {
		return st, err
	}
	var errs []error
	if truncated != nil {
		errs = append(errs, fmt.Errorf("%w (the %d rule-windows listed were copied; raise --max-keys): %w", ErrKeysTruncated, len(keys), truncated))
	}
	if len(st.Skipped) > 0 {
		errs = append(errs, fmt.Errorf("%w (raise --max-principals): %s", ErrSkipped, strings.Join(st.Skipped, "; ")))
	}
	if gap := gapError(st.Previous, now, o.RetentionDays); gap != nil {
		errs = append(errs, gap)
	}
	return st, errors.Join(errs...)
}

// copyWindows upserts the rule-windows of keys, read from src.
func copyWindows(ctx context.Context, tx pgx.Tx, src ledger.Reader, keys []ledger.Key, o *SyncOptions, now time.Time, st *SyncStats) error {
	for _, k := range keys {
		d, err := src.Read(ctx, k.Rule, k.Window)
		if errors.Is(err, ledger.ErrTooMany) {
			st.Skipped = append(st.Skipped, fmt.Sprintf("%s %s (%v)", k.Rule, k.Window, err))
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s %s: %w", k.Rule, k.Window, err)
		}
		if d.Empty() {
			continue
		}
		n, err := upsertWindow(ctx, tx, &d, o.Names(d.Rule), o.Location, now)
		if err != nil {
			return fmt.Errorf("write %s %s: %w", k.Rule, k.Window, err)
		}
		st.Windows++
		st.Rows += principalCount(&d)
		st.Changed += n
	}
	return nil
}

func principalCount(d *ledger.Data) int {
	n := len(d.Usage)
	for p := range d.PrincipalDenials {
		if _, ok := d.Usage[p]; !ok {
			n++
		}
	}
	return n
}

// usageNames and windowNames are the names an upsert leaves a row: its
// own when the sync's are guessed ($18, Names.Guessed), else the sync's.
const (
	usageNames = `CASE WHEN $18 THEN u.budget_set ELSE EXCLUDED.budget_set END, CASE WHEN $18 THEN u.budget ELSE EXCLUDED.budget END,
       CASE WHEN $18 THEN u.gateway ELSE EXCLUDED.gateway END, CASE WHEN $18 THEN u.measure ELSE EXCLUDED.measure END`
	windowNames = `CASE WHEN $18 THEN w.budget_set ELSE EXCLUDED.budget_set END, CASE WHEN $18 THEN w.budget ELSE EXCLUDED.budget END,
       CASE WHEN $18 THEN w.gateway ELSE EXCLUDED.gateway END, CASE WHEN $18 THEN w.measure ELSE EXCLUDED.measure END`
)

const upsertUsage = `
INSERT INTO ledger_usage AS u (domain, rule, window_label, principal, principal_key, principal_name, window_kind, window_start, window_end,
    budget_set, budget, gateway, measure, units, shadow_denials, enforce_denials, reserve_denials, synced_at)
SELECT $1, $2, $3, t.p, sha256(convert_to(t.p, 'UTF8')), t.n, $4, $5, $6, $7, $8, $9, $10, t.units, t.s, t.e, t.r, $11
FROM unnest($12::text[], $13::text[], $14::bigint[], $15::bigint[], $16::bigint[], $17::bigint[]) AS t(p, n, units, s, e, r)
ON CONFLICT (domain, rule, window_label, principal_key) DO UPDATE SET
    units = GREATEST(u.units, EXCLUDED.units),
    shadow_denials = GREATEST(u.shadow_denials, EXCLUDED.shadow_denials),
    enforce_denials = GREATEST(u.enforce_denials, EXCLUDED.enforce_denials),
    reserve_denials = GREATEST(u.reserve_denials, EXCLUDED.reserve_denials),
    principal_name = EXCLUDED.principal_name, window_start = EXCLUDED.window_start, window_end = EXCLUDED.window_end,
    (budget_set, budget, gateway, measure) = (` + usageNames + `),
    synced_at = EXCLUDED.synced_at
WHERE (u.units, u.shadow_denials, u.enforce_denials, u.reserve_denials, u.principal_name, u.window_start, u.window_end,
       u.budget_set, u.budget, u.gateway, u.measure)
    IS DISTINCT FROM
      (GREATEST(u.units, EXCLUDED.units), GREATEST(u.shadow_denials, EXCLUDED.shadow_denials),
       GREATEST(u.enforce_denials, EXCLUDED.enforce_denials), GREATEST(u.reserve_denials, EXCLUDED.reserve_denials),
       EXCLUDED.principal_name, EXCLUDED.window_start, EXCLUDED.window_end, ` + usageNames + `)`

const upsertWindowTotals = `
INSERT INTO ledger_windows AS w (domain, rule, window_label, window_kind, window_start, window_end,
    budget_set, budget, gateway, measure, shadow_denials, enforce_denials, reserve_denials, holds, held_units, expired_units, synced_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
ON CONFLICT (domain, rule, window_label) DO UPDATE SET
    shadow_denials = GREATEST(w.shadow_denials, EXCLUDED.shadow_denials),
    enforce_denials = GREATEST(w.enforce_denials, EXCLUDED.enforce_denials),
    reserve_denials = GREATEST(w.reserve_denials, EXCLUDED.reserve_denials),
    holds = GREATEST(w.holds, EXCLUDED.holds),
    held_units = GREATEST(w.held_units, EXCLUDED.held_units),
    expired_units = GREATEST(w.expired_units, EXCLUDED.expired_units),
    window_start = EXCLUDED.window_start, window_end = EXCLUDED.window_end,
    (budget_set, budget, gateway, measure) = (` + windowNames + `),
    synced_at = EXCLUDED.synced_at
WHERE (w.shadow_denials, w.enforce_denials, w.reserve_denials, w.holds, w.held_units, w.expired_units,
       w.window_start, w.window_end, w.budget_set, w.budget, w.gateway, w.measure)
    IS DISTINCT FROM
      (GREATEST(w.shadow_denials, EXCLUDED.shadow_denials), GREATEST(w.enforce_denials, EXCLUDED.enforce_denials),
       GREATEST(w.reserve_denials, EXCLUDED.reserve_denials), GREATEST(w.holds, EXCLUDED.holds),
       GREATEST(w.held_units, EXCLUDED.held_units), GREATEST(w.expired_units, EXCLUDED.expired_units),
       EXCLUDED.window_start, EXCLUDED.window_end, ` + windowNames + `)`

// rows are one rule-window's principal rows as column arrays.
type rows struct {
	principal, name []string
	units           []*int64
	shadow, enforce []int64
	reserve         []int64
}

func columns(d *ledger.Data) (rows, error) {
	var r rows
	seen := map[string]bool{}
	for p := range d.Usage {
		seen[p] = true
	}
	for p := range d.PrincipalDenials {
		seen[p] = true
	}
	names := make([]string, 0, len(seen))
	for p := range seen {
		names = append(names, p)
	}
	sort.Strings(names) // a deterministic statement
	for _, p := range names {
		var units *int64
		if u, ok := d.Usage[p]; ok {
			v, err := toInt64(u, "usage of "+p)
			if err != nil {
				return r, err
			}
			units = &v
		}
		pd := d.PrincipalDenials[p]
		s, err1 := toInt64(pd.Shadow, "denials")
		e, err2 := toInt64(pd.Enforce, "denials")
		rs, err3 := toInt64(pd.Reserve, "denials")
		if err := firstErr(err1, err2, err3); err != nil {
			return r, err
		}
		r.principal, r.name = append(r.principal, storedPrincipal(p)), append(r.name, displayName(p))
		r.units, r.shadow, r.enforce, r.reserve = append(r.units, units), append(r.shadow, s), append(r.enforce, e), append(r.reserve, rs)
	}
	return r, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// upsertWindow writes one rule-window: its principals and its totals.
func upsertWindow(ctx context.Context, tx pgx.Tx, d *ledger.Data, n Names, loc *time.Location, now time.Time) (int64, error) {
	r, err := columns(d)
	if err != nil {
		return 0, err
	}
	start, end := timeOf(d.Window, loc)
	kind, label := d.Window.Period.String(), d.Window.ID()
	tag, err := tx.Exec(ctx, upsertUsage, d.Rule.Domain, d.Rule.Rule, label, kind, start, end, n.BudgetSet, n.Budget, n.Gateway, n.Measure, now,
		r.principal, r.name, r.units, r.shadow, r.enforce, r.reserve, n.Guessed)
	if err != nil {
		return 0, err
	}
	totals, err := windowTotals(d)
	if err != nil {
		return 0, err
	}
	args := append([]any{d.Rule.Domain, d.Rule.Rule, label, kind, start, end, n.BudgetSet, n.Budget, n.Gateway, n.Measure}, totals...)
	tag2, err := tx.Exec(ctx, upsertWindowTotals, append(args, now, n.Guessed)...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected() + tag2.RowsAffected(), nil
}

// windowTotals are a rule-window's ledger_windows counts, in column order:
// shadow, enforce and reserve denials, holds, held and expired units.
func windowTotals(d *ledger.Data) ([]any, error) {
	vals := []uint64{d.Denials.Shadow, d.Denials.Enforce, d.Denials.Reserve, d.Holds.Count, d.Holds.Held, d.Holds.Expired}
	out := make([]any, len(vals))
	for i, v := range vals {
		n, err := toInt64(v, "window total")
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}
