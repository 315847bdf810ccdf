package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/report"
	"github.com/budgetgen/budgetgen/internal/safetext"
)

// reportOptions are the flags of budgetgen report.
type reportOptions struct {
	src          ledgerSource
	specFile     string
	days         int
	format       string
	targetShare  float64
	maxShare     float64
	timeZone     string
	includeToday bool
	headroom     float64
	top          int
	output       string
	budgets      []string
	now          string // hidden: RFC 3339 clock for tests
}

func newReportCmd(e *env) *cobra.Command {
	o := &reportOptions{src: ledgerSource{postgresIsSource: true}}
	cmd := &cobra.Command{
		Use:   "report (--valkey ADDR | --service URL | --postgres DSN) [--spec FILE] [--days 7] [--format text|json|markdown|html]",
		Short: "Report the shadow measurements of every budget cap, with a verdict per cap",
		Long: `report reads the ledger the rate limit service keeps (per rule and per hour, day,
ISO week or month window: each principal's usage and its would-be, real and
reservation denials) and judges each cap of each budget on its own window: an
hour cap on the hours of the report's days, a day cap on its days, a week or
month cap on the last complete week or month measured in full (or, when there
is none yet, on a projection of the measured part, marked as such). It opens
with a summary table: per cap the budget, window, cap, mode, principals over,
would-be 429s, suggested cap and a verdict (ready to promote, not yet and
why). Then per budget its days, and per cap p50/p95/p99/max usage per
principal and window, windows over the cap, the principals over it (the --top
N with most usage above it), outliers (listed apart), and override principals,
each against its own cap. Money caps read in their currency.

The days are the --days completed days before today in --time-zone (the
service's RESET_TIME_ZONE); --include-today adds today so far, marked partial
(it never counts as a full day for promote). A cap is ready to promote after 7
full days measured with a share of principal-windows over it under
--max-limited-share, as promote --evidence judges it.

Suggested caps: with at least 20 principals, the smallest cap that limits at
most --target-share of principal-windows; for a shared bucket (group,
frontier), fewer principals, or too few principal-windows for the share, the
observed peak times --headroom (default 1.2) rounded up to two significant
digits, never the peak itself. With --spec, rules are named by budget and caps
come from the spec (it is loaded and rendered as render does); without it, a
budget map's buckets still name their budgets. Sources: a standalone Valkey or
a cluster (give any node; several with commas; the password, if any, from
$` + passwordEnv + `), a service on its embedded store (--service, its debug
port URL), or the durable ledger in PostgreSQL (--postgres: months of history,
as budgetgen ledger sync copies it). The JSON output is the evidence budgetgen
promote --evidence reads.`,
		Example: `  budgetgen report --valkey 127.0.0.1:6379 --spec budgets.yaml
  budgetgen report --valkey valkey-0:6379,valkey-1:6379 --spec budgets.yaml --format html > week.html
  budgetgen report --valkey 127.0.0.1:6379 --spec budgets.yaml --format json --budget per-run > evidence.json
  budgetgen report --service http://127.0.0.1:6070 --spec budgets.yaml   # embedded store
  PGPASSWORD=... budgetgen report --postgres postgres://budgetgen@db/ledger --spec budgets.yaml --time-zone Europe/Paris`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReport(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	o.src.addFlags(f, postgresDSNHelp)
	f.StringVar(&o.specFile, "spec", "", "BudgetSet spec: names rules by budget and gives caps")
	f.IntVar(&o.days, "days", report.DefaultDays, "completed UTC days to report, ending yesterday")
	f.StringVar(&o.format, "format", report.FormatText, "output format: "+strings.Join(report.Formats, ", "))
	f.Float64Var(&o.targetShare, "target-share", report.DefaultTargetLimitedShare, "share of principal-windows a suggested cap may limit")
	f.Float64Var(&o.maxShare, "max-limited-share", report.DefaultMaxLimitedShare, "a cap is ready to promote with a share of principal-windows over it strictly under this (as promote --evidence)")
	f.StringVar(&o.timeZone, "time-zone", "UTC", "IANA zone of the day, week and month windows: the rate limit service's RESET_TIME_ZONE")
	f.BoolVar(&o.includeToday, "include-today", false, "add today's UTC day so far (marked partial)")
	f.Float64Var(&o.headroom, "headroom", report.DefaultHeadroom, "factor over the observed peak for peak-based suggestions (shared buckets, few principals); above 1")
	f.IntVar(&o.top, "top", report.DefaultTopN, "list at most this many principals over the cap per budget")
	f.StringVarP(&o.output, "output", "o", "", "write the report to `FILE` atomically instead of stdout; {to} in FILE becomes the window's last day (YYYY-MM-DD)")
	f.StringSliceVar(&o.budgets, "budget", nil, "report only these budgets (repeatable)")
	f.StringVar(&o.now, "now", "", "RFC 3339 time used as the current time")
	_ = f.MarkHidden("now")
	return cmd
}

func (o *reportOptions) validate() error {
	if err := o.src.validate(); err != nil {
		return err
	}
	if _, err := report.WriterFor(o.format); err != nil {
		return usageError("--format: %v", err)
	}
	if o.days < 1 || o.days > report.MaxDays {
		return usageError("--days %d: must be within [1, %d]", o.days, report.MaxDays)
	}
	// Written so NaN fails too: every comparison with it is false.
	if !(o.targetShare > 0 && o.targetShare < 1) {
		return usageError("--target-share %v: must be within (0, 1)", o.targetShare)
	}
	if !(o.maxShare > 0 && o.maxShare < 1) {
		return usageError("--max-limited-share %v: must be within (0, 1)", o.maxShare)
	}
	if _, err := loadZone(o.timeZone); err != nil {
		return usageError("--time-zone: %v", err)
	}
	if !(o.headroom > 1 && o.headroom <= report.MaxHeadroom) {
		return usageError("--headroom %v: must be above 1 and at most %d (a cap exactly at the peak denies the next busier day)", o.headroom, report.MaxHeadroom)
	}
	if o.top < 1 {
		return usageError("--top %d: must be at least 1", o.top)
	}
	return nil
}

func runReport(ctx context.Context, e *env, o *reportOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	now := time.Now().UTC()
	if o.now != "" {
		t, err := time.Parse(time.RFC3339, o.now)
		if err != nil {
			return usageError("--now: %v", err)
		}
		now = t
	}
	m, err := o.mapping(ctx, e)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.src.timeout)
	defer cancel()
	rd, where, closeReader, err := o.src.open(ctx)
	if err != nil {
		return failure(err)
	}
	defer closeReader()
	loc, _ := loadZone(o.timeZone)
	ropts := report.Options{
		Now: now, Days: o.days, Location: loc, TargetLimitedShare: o.targetShare, MaxLimitedShare: o.maxShare, Only: o.budgets,
		IncludeToday: o.includeToday, Headroom: o.headroom, TopN: o.top,
	}
	windows, err := report.ReadWindows(ropts)
	if err != nil {
		return failure(err)
	}
	data, err := ledger.ReadAll(ctx, rd, windows)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return failure(fmt.Errorf("reading the ledger took longer than --timeout %s: %w", o.src.timeout, err))
		}
		return failure(fmt.Errorf("read ledger: %w", err))
	}
	r, err := report.Build(data, m, ropts)
	if err != nil {
		return failure(err)
	}
	switch {
	case len(data) == 0:
		_, _ = fmt.Fprintf(e.stderr, "budgetgen: no measurements in the ledger for %s..%s in %s: is the rate limit service writing there?\n", r.From, r.To, safetext.Inline(where)) // a warning, not the output
	case r.NoData != "":
		_, _ = fmt.Fprintf(e.stderr, "budgetgen: %s\n", safetext.Inline(r.NoData)) // a warning, not the output
	}
	return o.write(e, r)
}

// mapping loads the spec, as render loads it (base policies included), and
// renders it to number the rules as the deployed policies do; no spec is an
// empty mapping.
func (o *reportOptions) mapping(ctx context.Context, e *env) (report.Mapping, error) {
	if o.specFile == "" {
		return report.Mapping{}, nil
	}
	bs, err := loadSpecFile(ctx, o.specFile, e.stdin)
	if err != nil {
		return report.Mapping{}, specError(err)
	}
	m, err := report.MappingFromSpec(bs)
	if err != nil {
		return report.Mapping{}, failure(err)
	}
	return m, nil
}

// write writes the report to stdout or, built in memory first so a failed
// run never leaves a partial report, atomically to -o.
func (o *reportOptions) write(e *env, r *report.Report) error {
	if o.format != report.FormatText {
		for _, w := range r.Warnings {
			_, _ = fmt.Fprintf(e.stderr, "budgetgen: warning: %s\n", safetext.Inline(w)) // a warning, not the output
		}
	}
	w, _ := report.WriterFor(o.format)
	if o.output == "" {
		return w(e.stdout, r)
	}
	var buf bytes.Buffer
	if err := w(&buf, r); err != nil {
		return failure(err)
	}
	path := strings.ReplaceAll(o.output, "{to}", r.To)
	if err := atomicfile.WriteFile(path, buf.Bytes(), atomicfile.Options{Perm: 0o644}); err != nil {
		return failure(err)
	}
	_, _ = fmt.Fprintf(e.stderr, "budgetgen: wrote %s\n", path) // a note: the file is written
	return nil
}

// loadZone reads an IANA zone name; "Local" is refused (a report must not
// depend on the machine it runs on).
func loadZone(name string) (*time.Location, error) {
	if name == "" || name == "Local" {
		return nil, fmt.Errorf("%q: want an IANA zone name such as UTC or Europe/Paris", name)
	}
	return time.LoadLocation(name)
}
