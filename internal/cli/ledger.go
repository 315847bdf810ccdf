package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ledgerpg"
	"github.com/budgetgen/budgetgen/internal/report"
	"github.com/budgetgen/budgetgen/internal/safetext"
)

// ledgerSyncOptions are the flags of budgetgen ledger sync.
type ledgerSyncOptions struct {
	src      ledgerSource
	specFile string
	timeZone string
	// retentionDays is the service's LEDGER_RETENTION_DAYS: a previous
	// sync older than it is reported as a gap.
	retentionDays int
	now           string // hidden: RFC 3339 clock for tests (synced_at)
}

func newLedgerCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ledger",
		Short: "Keep the rate limit service's ledger durably in PostgreSQL",
		Args:  cobra.NoArgs,
		// Runnable, so that cobra checks Args: a command without RunE
		// prints its help and exits 0 for any argument, a misspelt
		// subcommand included.
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newLedgerSyncCmd(e))
	return cmd
}

func newLedgerSyncCmd(e *env) *cobra.Command {
	o := &ledgerSyncOptions{}
	cmd := &cobra.Command{
		Use:   "sync (--valkey ADDR | --service URL) --postgres DSN [--spec FILE] [--time-zone ZONE]",
		Short: "Copy the ledger's closed and running windows into PostgreSQL (idempotent)",
		Long: `ledger sync copies every window the rate limit service's ledger still holds
(hours, days, ISO weeks and months, closed and running: the service keeps each
for its retention, 10 days by default, after it ends) into PostgreSQL, one row
per rule, window and principal with its usage (tokens, or money for a money
cap) and its would-be, real and reservation denials, and one row per rule and
window with the window's totals. Run it more often than the retention (the
CronJob in deploy/ledger-sync runs it hourly): the durable ledger then holds
every window for months, for budgetgen report --postgres and budgetgen export.
Each run records its time; when the previous run from the same ledger is older
than --retention-days (the service's LEDGER_RETENTION_DAYS), windows expired
before a run copied them: the run copies what is left, names them and exits 1.
A Valkey node with more ledger keys than --max-keys is listed up to that bound
(memory stays bounded): the run copies the rule-windows listed, says which node
was cut short and exits 1.

The schema is created or upgraded first (embedded migrations, under an advisory
lock). The copy is one transaction of upserts keeping the larger of the stored
and the read value: running it twice gives the same rows, and a ledger that
lost data never lowers a recorded row. The rate limit service never talks to
PostgreSQL.

--spec names the rules of a service run without a budget map (Envoy Gateway's
<ns>/<policy>/rule/<i>) by budget and measure; a budget map's buckets name
themselves. --time-zone is the service's RESET_TIME_ZONE: window_start and
window_end are the windows' instants in it. The DSN carries no password:
$PGPASSWORD or a .pgpass file does (libpq conventions); the Valkey password,
if any, comes from $` + passwordEnv + `.`,
		Example: `  PGPASSWORD=... budgetgen ledger sync --valkey valkey:6379 --postgres postgres://budgetgen@db:5432/ledger?sslmode=require
  budgetgen ledger sync --service http://127.0.0.1:6070 --postgres 'host=/var/run/postgresql dbname=ledger' --spec budgets.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runLedgerSync(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	o.src.addFlags(f, "")
	f.StringVar(&o.src.postgres, "postgres", "", "PostgreSQL DSN of the durable ledger (required; no password in it: $PGPASSWORD or a .pgpass file)")
	f.StringVar(&o.specFile, "spec", "", "BudgetSet spec: names the rules of a service run without a budget map")
	f.StringVar(&o.timeZone, "time-zone", "UTC", "IANA zone of the day, week and month windows: the rate limit service's RESET_TIME_ZONE")
	f.IntVar(&o.retentionDays, "retention-days", ledger.DefaultRetentionDays, "the rate limit service's LEDGER_RETENTION_DAYS: a previous sync older than this many days is reported (exit 1) as a gap in the copy")
	f.StringVar(&o.now, "now", "", "RFC 3339 time used as the current time")
	_ = f.MarkHidden("now")
	return cmd
}

func (o *ledgerSyncOptions) validate() error {
	if err := o.src.validate(); err != nil {
		return err
	}
	if o.src.postgres == "" {
		return usageError("--postgres DSN is required: the durable ledger to copy into")
	}
	if _, err := loadZone(o.timeZone); err != nil {
		return usageError("--time-zone: %v", err)
	}
	if o.retentionDays < ledger.MinRetentionDays || o.retentionDays > ledger.MaxRetentionDays {
		return usageError("--retention-days %d: the service keeps [%d, %d] (its LEDGER_RETENTION_DAYS)", o.retentionDays, ledger.MinRetentionDays, ledger.MaxRetentionDays)
	}
	return nil
}

func runLedgerSync(ctx context.Context, e *env, o *ledgerSyncOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	now, err := clockFlag(o.now)
	if err != nil {
		return err
	}
	names, err := o.names(ctx, e)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.src.timeout)
	defer cancel()
	db, err := o.src.openPostgres(ctx)
	if err != nil {
		if errors.Is(err, ledgerpg.ErrPasswordInDSN) {
			return usageError("--postgres: %v", err)
		}
		return failure(err)
	}
	defer func() { _ = db.Close(context.WithoutCancel(ctx)) }() // the sync committed or rolled back already
	if err := db.Migrate(ctx); err != nil {
		return failure(err)
	}
	src, where, closeSrc, err := o.src.open(ctx)
	if err != nil {
		return failure(err)
	}
	defer closeSrc()
	loc, _ := loadZone(o.timeZone)
	st, err := db.Sync(ctx, src, ledgerpg.SyncOptions{Location: loc, Names: names, Now: func() time.Time { return now },
		Source: o.src.identity(), RetentionDays: o.retentionDays})
	if err != nil && !errors.Is(err, ledgerpg.ErrSkipped) && !errors.Is(err, ledgerpg.ErrGap) && !errors.Is(err, ledgerpg.ErrKeysTruncated) {
		return failure(fmt.Errorf("sync from %s: %w (nothing was written: the copy is one transaction)", safetext.Inline(where), err))
	}
	if _, werr := fmt.Fprintf(e.stdout, "ledger sync: %d rule-windows, %d principal rows from %s; %d rows new or changed\n", st.Windows, st.Rows, safetext.Inline(where), st.Changed); werr != nil {
		return werr
	}
	if err != nil {
		// The rest is committed; the job still fails so the skipped windows,
		// the keys past --max-keys, or the windows lost before this run, are seen.
		return failure(fmt.Errorf("sync from %s: %w", safetext.Inline(where), err))
	}
	return nil
}

// names is how rules are named: by the spec's rendered policies and budget
// map when given, else by the buckets alone.
func (o *ledgerSyncOptions) names(ctx context.Context, e *env) (ledgerpg.Namer, error) {
	if o.specFile == "" {
		return ledgerpg.BucketNames, nil
	}
	bs, err := loadSpecFile(ctx, o.specFile, e.stdin)
	if err != nil {
		return nil, specError(err)
	}
	m, err := report.MappingFromSpec(bs)
	if err != nil {
		return nil, failure(err)
	}
	set := bs.Metadata.Name
	return func(r ledger.RuleID) ledgerpg.Names {
		n := ledgerpg.BucketNames(r)
		info, ok := m.Rules[r]
		if !ok || r.Domain == ledger.BudgetDomain {
			return n
		}
		n.BudgetSet, n.Budget, n.Measure, n.Guessed = set, info.Budget, ledgerpg.MeasureTokens, false
		switch {
		case info.Measure == report.MeasureCost:
			n.Measure = ledgerpg.MeasureCost
		case info.Scale > 1:
			n.Measure = ledgerpg.MeasureKiloTokens
		}
		return n
	}, nil
}

// clockFlag is the hidden --now flag's time, or now.
func clockFlag(s string) (time.Time, error) {
	if s == "" {
		return time.Now().UTC(), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, usageError("--now: %v", err)
	}
	return t.UTC(), nil
}
