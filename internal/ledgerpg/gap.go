package ledgerpg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrGap is wrapped by Sync's error when the previous sync from the same
// source is older than the source's retention: windows that ended after it
// expired from the service's ledger before any sync copied them. What the
// source still held is committed; the error says which windows may lack
// usage, once (the next sync's previous one is this).
var ErrGap = errors.New("windows expired from the ledger before a sync copied them")

// recordSync reads when the previous sync from source committed (zero for
// the first) and records this one, in the sync's transaction: a sync that
// rolls back leaves the record as it was. Two syncs at once keep the later
// clock.
func recordSync(ctx context.Context, tx pgx.Tx, source string, now time.Time) (time.Time, error) {
	if source == "" {
		return time.Time{}, nil
	}
	var prev time.Time
	err := tx.QueryRow(ctx, `SELECT synced_at FROM ledger_syncs WHERE source = $1`, source).Scan(&prev)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return prev, fmt.Errorf("read the previous sync: %w", err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO ledger_syncs AS s (source, synced_at) VALUES ($1, $2)
		ON CONFLICT (source) DO UPDATE SET synced_at = GREATEST(s.synced_at, EXCLUDED.synced_at)`, source, now)
	if err != nil {
		return prev, fmt.Errorf("record the sync: %w", err)
	}
	return prev.UTC(), nil
}

// gapError is ErrGap when prev, the previous sync, is more than
// retentionDays before now: a window that ended after prev expired (its end
// plus the retention, ledger.Window.ExpireAt) before now unless it ended
// after now minus the retention.
func gapError(prev, now time.Time, retentionDays int) error {
	retention := time.Duration(retentionDays) * 24 * time.Hour
	if prev.IsZero() || now.Sub(prev) <= retention {
		return nil
	}
	return fmt.Errorf("%w: the previous sync from this ledger committed at %s, %s before this one, longer than its retention of %d days: "+
		"windows that ended between %s and %s expired before a sync copied them, so PostgreSQL may lack what they recorded after %s "+
		"(the rest is committed; see docs/runbook.md, \"ledger sync: a gap\")",
		ErrGap, prev.Format(time.RFC3339), days(now.Sub(prev)), retentionDays,
		prev.Format(time.RFC3339), now.Add(-retention).Format(time.RFC3339), prev.Format(time.RFC3339))
}

// days writes d as whole days and the rest: 10d1h0m0s.
func days(d time.Duration) string {
	const day = 24 * time.Hour
	return fmt.Sprintf("%dd%s", d/day, d%day)
}
