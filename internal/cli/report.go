package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/report"
	"github.com/budgetgen/budgetgen/internal/safetext"
)

// reportOptions are the flags of budgetgen report.
type reportOptions struct {
	valkeyAddrs  []string
	service      string
	username     string
	tls          bool
	prefix       string
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
	dialTimeout  time.Duration
	timeout      time.Duration
	maxPrincipal int
	now          string // hidden: RFC 3339 clock for tests
}

// passwordEnv names the environment variable holding the Valkey password:
// never a flag, so it stays out of shell history and process listings.
const passwordEnv = "BUDGETGEN_VALKEY_PASSWORD"

func newReportCmd(e *env) *cobra.Command {
	o := &reportOptions{}
	cmd := &cobra.Command{
		Use:   "report (--valkey ADDR | --service URL) [--spec FILE] [--days 7] [--format text|json|markdown|html]",
		Short: "Report a week of shadow measurements from the rate limit service's ledger",
		Long: `report reads the ledger the rate limit service keeps in Valkey (per token rule,
per UTC day, each principal's usage; per rule and day the would-be and real
denials) and prints, per budget and per day: principals seen, p50/p95/p99/max
daily usage, principal-days over the cap, would-be 429s, tokens above the cap,
and a suggested cap for a target share of principal-days limited.

The window is the --days completed UTC days before today; --include-today adds
today so far, marked partial in every format (it never counts as a full shadow
day for promote). Per budget, the principals over the cap are listed (the --top
N with most tokens above it) with their days over and would-be 429s; override
principals are reported on their own, each against its own cap, and the
default cap is judged and suggested from the other principals only.

Suggested caps: with at least 20 principals, the smallest cap that limits at
most --target-share of principal-days; for a shared bucket (group, frontier),
fewer principals, or too few principal-days for the share, the observed peak
times --headroom (default 1.2) rounded up to two significant digits, never the
peak itself. Each suggestion says what it is based on. With --spec, rules are
named by budget (the spec is rendered to number its rules as the deployed
policies do); without it, each rule is reported on its own. Works against a
standalone Valkey or a cluster (give any node; several with commas). The
password, if any, is read from $` + passwordEnv + `.
A service running on its embedded store (no Valkey) keeps the ledger in its
own memory: read it with --service and the service's debug port URL.
The JSON output is the evidence budgetgen promote --evidence reads.`,
		Example: `  budgetgen report --valkey 127.0.0.1:6379 --spec budgets.yaml
  budgetgen report --valkey valkey-0:6379,valkey-1:6379 --spec budgets.yaml --format html > week.html
  budgetgen report --valkey 127.0.0.1:6379 --spec budgets.yaml --format json --budget per-run > evidence.json
  budgetgen report --service http://127.0.0.1:6070 --spec budgets.yaml   # embedded store`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReport(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.valkeyAddrs, "valkey", nil, "Valkey address host:port (any cluster node; comma-separated seeds allowed)")
	f.StringVar(&o.service, "service", "", "instead of --valkey: the debug port URL of a rate limit service on its embedded store, e.g. http://127.0.0.1:6070")
	f.StringVar(&o.username, "valkey-username", "", "Valkey ACL user (password from $"+passwordEnv+")")
	f.BoolVar(&o.tls, "valkey-tls", false, "connect to Valkey with TLS (system roots)")
	f.StringVar(&o.prefix, "prefix", "", "key prefix the service uses (its CACHE_KEY_PREFIX)")
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
	f.DurationVar(&o.dialTimeout, "dial-timeout", 3*time.Second, "give up connecting to Valkey after this long")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up reading the ledger after this long")
	f.IntVar(&o.maxPrincipal, "max-principals", ledger.DefaultMaxPrincipals, "refuse rule-days with more principals than this (memory bound)")
	f.StringVar(&o.now, "now", "", "RFC 3339 time used as the current time")
	_ = f.MarkHidden("now")
	return cmd
}

func (o *reportOptions) validate() error {
	switch {
	case len(o.valkeyAddrs) == 0 && o.service == "":
		return usageError("--valkey ADDR is required (the Valkey the rate limit service writes its ledger to), or --service URL for a service on its embedded store")
	case len(o.valkeyAddrs) > 0 && o.service != "":
		return usageError("--valkey and --service: give one (where the service keeps its ledger)")
	case o.service != "" && !strings.HasPrefix(o.service, "http://") && !strings.HasPrefix(o.service, "https://"):
		return usageError("--service %q: want an http:// or https:// URL (the service's debug port)", o.service)
	case o.service != "" && (o.prefix != "" || o.username != "" || o.tls):
		return usageError("--prefix, --valkey-username and --valkey-tls are for --valkey; --service reads the service's own ledger")
	}
	if _, err := report.WriterFor(o.format); err != nil {
		return usageError("--format: %v", err)
	}
	if o.days < 1 || o.days > report.MaxDays {
		return usageError("--days %d: must be within [1, %d]", o.days, report.MaxDays)
	}
	if o.targetShare <= 0 || o.targetShare >= 1 {
		return usageError("--target-share %v: must be within (0, 1)", o.targetShare)
	}
	if o.maxShare <= 0 || o.maxShare >= 1 {
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
	if o.dialTimeout <= 0 || o.timeout <= 0 {
		return usageError("--dial-timeout and --timeout must be positive")
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
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	rd, where, closeReader, err := o.openReader(ctx)
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
			return failure(fmt.Errorf("reading the ledger took longer than --timeout %s: %w", o.timeout, err))
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

// openReader opens the ledger the flags name and says where it is.
func (o *reportOptions) openReader(ctx context.Context) (ledger.Reader, string, func(), error) {
	if o.service != "" {
		rd := &ledger.HTTPReader{Base: o.service, Client: &http.Client{Timeout: o.timeout}, MaxPrincipals: o.maxPrincipal}
		return rd, "the service at " + o.service, func() {}, nil
	}
	lv, closeClient, err := o.openValkey()
	if err != nil {
		return nil, "", nil, err
	}
	return lv, fmt.Sprintf("this Valkey (prefix %q)", o.prefix), closeClient, nil
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

// openValkey connects to the Valkey the service writes its ledger to.
func (o *reportOptions) openValkey() (*ledger.Valkey, func(), error) {
	opt := valkey.ClientOption{
		InitAddress:      o.valkeyAddrs,
		Username:         o.username,
		Password:         os.Getenv(passwordEnv),
		DisableCache:     true,
		Dialer:           net.Dialer{Timeout: o.dialTimeout},
		ConnWriteTimeout: o.dialTimeout,
	}
	if o.tls {
		opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	client, err := valkey.NewClient(opt)
	if err != nil {
		return nil, nil, fmt.Errorf("valkey %s unreachable: %w (check --valkey; the report needs the Valkey the rate limit service writes to)", strings.Join(o.valkeyAddrs, ","), err)
	}
	lv := ledger.NewValkey(client, o.prefix)
	lv.MaxPrincipals = o.maxPrincipal
	return lv, client.Close, nil
}
