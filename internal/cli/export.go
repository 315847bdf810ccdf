package cli

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/internal/export"
	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/report"
	"github.com/budgetgen/budgetgen/internal/safetext"
)

// exportOptions are the flags of budgetgen export.
type exportOptions struct {
	src      ledgerSource
	format   string
	specFile string
	from, to string
	period   string
	timeZone string
	provider string
	output   string
	now      string // hidden: RFC 3339 clock for tests
}

func newExportCmd(e *env) *cobra.Command {
	o := &exportOptions{src: ledgerSource{postgresIsSource: true}}
	cmd := &cobra.Command{
		Use:   "export --format focus|csv (--postgres DSN | --valkey ADDR | --service URL) [--from DATE --to DATE] [--period day|month]",
		Short: "Write a chargeback file (FinOps FOCUS 1.2 or CSV) from the ledger",
		Long: `export writes one row per principal, budget and charge period (a day, or a
month with --period month) from the ledger: the tokens consumed and, for a
budget with a money cap, the cost the spec's price table gave it (as Envoy AI
Gateway computed it per request). A budget's tokens are counted once, from
one window length (its rules count the same tokens in every window).

--format focus writes a FinOps FOCUS 1.2 cost-and-usage CSV: every column the
specification makes mandatory, tokens as ConsumedQuantity (unit Tokens), cost
as BilledCost (and effective, list, contracted), the budget set as billing
account, the budget and principal as Tags, and the would-be, real and
reservation 429s as x_ custom columns. --format csv writes a plain CSV for
spreadsheets.

The charge periods are those starting in [--from, --to) (dates in
--time-zone, the service's RESET_TIME_ZONE; default: last calendar month);
times are written in UTC. Read from the durable ledger (--postgres: months of
history) or, for recent windows, from Valkey or the service's debug port.
--spec names budgets of a service run without a budget map and gives the
currency (spec.pricing.currency; USD without one).`,
		Example: `  PGPASSWORD=... budgetgen export --format focus --postgres postgres://budgetgen@db/ledger --spec budgets.yaml -o focus-{from}.csv
  budgetgen export --format csv --valkey valkey:6379 --from 2026-11-01 --to 2026-11-08 --period day`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runExport(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	o.src.addFlags(f, postgresDSNHelp)
	f.StringVar(&o.format, "format", export.FormatFOCUS, "output format: "+strings.Join(export.Formats, ", "))
	f.StringVar(&o.specFile, "spec", "", "BudgetSet spec: names rules by budget and gives the currency")
	f.StringVar(&o.from, "from", "", "first day of the export, YYYY-MM-DD (default: the 1st of last month)")
	f.StringVar(&o.to, "to", "", "day after the export, YYYY-MM-DD (default: the 1st of this month)")
	f.StringVar(&o.period, "period", export.PeriodDay, "charge period: day or month")
	f.StringVar(&o.timeZone, "time-zone", "UTC", "IANA zone of the day, week and month windows: the rate limit service's RESET_TIME_ZONE")
	f.StringVar(&o.provider, "provider", "budgetgen", "FOCUS ProviderName, PublisherName and InvoiceIssuerName: the platform running the gateways")
	f.StringVarP(&o.output, "output", "o", "", "write to `FILE` atomically instead of stdout; {from} in FILE becomes the first day")
	f.StringVar(&o.now, "now", "", "RFC 3339 time used as the current time")
	_ = f.MarkHidden("now")
	return cmd
}

// options validates the flags into export options.
func (o *exportOptions) options() (export.Options, error) {
	if err := o.src.validate(); err != nil {
		return export.Options{}, err
	}
	if _, err := export.WriterFor(o.format); err != nil {
		return export.Options{}, usageError("--format: %v", err)
	}
	loc, err := loadZone(o.timeZone)
	if err != nil {
		return export.Options{}, usageError("--time-zone: %v", err)
	}
	now, err := clockFlag(o.now)
	if err != nil {
		return export.Options{}, err
	}
	y, m, _ := now.In(loc).Date()
	thisMonth := time.Date(y, m, 1, 0, 0, 0, 0, loc)
	eo := export.Options{Period: o.period, Location: loc, From: thisMonth.AddDate(0, -1, 0), To: thisMonth}
	for _, d := range []struct {
		flag, val string
		into      *time.Time
	}{{"--from", o.from, &eo.From}, {"--to", o.to, &eo.To}} {
		if d.val == "" {
			continue
		}
		if *d.into, err = time.ParseInLocation(time.DateOnly, d.val, loc); err != nil {
			return export.Options{}, usageError("%s %q: want YYYY-MM-DD", d.flag, d.val)
		}
	}
	if _, err := export.Windows(eo); err != nil {
		return export.Options{}, usageError("%v", err)
	}
	return eo, nil
}

func runExport(ctx context.Context, e *env, o *exportOptions) error {
	eo, err := o.options()
	if err != nil {
		return err
	}
	m, err := o.mapping(ctx, e, &eo)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.src.timeout)
	defer cancel()
	rd, _, closeReader, err := o.src.open(ctx)
	if err != nil {
		return failure(err)
	}
	defer closeReader()
	windows, _ := export.Windows(eo) // validated by options
	data, err := ledger.ReadAll(ctx, rd, windows)
	if err != nil {
		return failure(fmt.Errorf("read ledger: %w", err))
	}
	rows, err := export.Build(data, m, eo)
	if err != nil {
		return failure(err)
	}
	w, _ := export.WriterFor(o.format)
	var buf bytes.Buffer
	if err := w(&buf, rows, export.Meta{Provider: o.provider}); err != nil {
		return failure(err)
	}
	if o.output == "" {
		_, err := e.stdout.Write(buf.Bytes())
		return err
	}
	path := strings.ReplaceAll(o.output, "{from}", eo.From.Format(time.DateOnly))
	if err := atomicfile.WriteFile(path, buf.Bytes(), atomicfile.Options{Perm: 0o644}); err != nil {
		return failure(err)
	}
	_, _ = fmt.Fprintf(e.stderr, "budgetgen: wrote %s (%d rows)\n", safetext.Inline(path), len(rows)) // a note: the file is written
	return nil
}

// mapping loads the spec (as render does) for budget names and the currency.
func (o *exportOptions) mapping(ctx context.Context, e *env, eo *export.Options) (report.Mapping, error) {
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
	eo.BudgetSet = bs.Metadata.Name
	if bs.Spec.Pricing != nil {
		eo.Currency = bs.Spec.Pricing.Currency
	}
	return m, nil
}
