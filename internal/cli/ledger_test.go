package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/pgtest"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// shadowFortnight fills a ledger as a service with the example's budget map
// records two weeks of traffic: per-human (day cap) on every day, a week and
// a month window, denials per principal. It returns the report's clock.
func shadowFortnight(t *testing.T, ctx context.Context, c valkey.Client) time.Time {
	t.Helper()
	// Valkey expires on its own clock: the fortnight starts tomorrow.
	day0 := ledger.DayOf(time.Now()) + 1
	now := (day0 + 14).Start().Add(9 * time.Hour)
	lv := ledger.NewValkey(c, "")
	rec, err := ledger.NewRecorder(ledger.Options{}, lv, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	human := ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "ai-budgets/per-human"}
	fleet := ledger.RuleID{Domain: ledger.BudgetDomain, Rule: "ai-budgets/agent-fleet"}
	var us []ledger.Usage
	for i := 0; i < 14; i++ {
		at := (day0 + ledger.Day(i)).Start().Add(10 * time.Hour)
		for p := 0; p < 25; p++ {
			us = append(us, rec.Usage(human, fmt.Sprintf("user%02d@example.com", p), at, uint64(50_000*(p+1)+1000*i)))
		}
		us = append(us, rec.Usage(human, "alice@example.com", at, 2_500_000))
		rec.DeniedIn(human, ledger.WindowAt(ledger.PeriodDay, at, nil), ledger.Denial{Principal: "alice@example.com", Shadow: true})
		us = append(us, rec.Usage(fleet, "", at, 150_000_000))
	}
	if err := lv.Add(ctx, us...); err != nil {
		t.Fatal(err)
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	return now
}

// TestLedgerSyncAndReportFromPostgres: ledger sync copies Valkey's ledger
// into PostgreSQL (a second run changes nothing), and report --postgres
// reads the same report back as report --valkey, in every format.
func TestLedgerSyncAndReportFromPostgres(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	pg := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{vk.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	now := shadowFortnight(t, ctx, c)
	spec := copyExample(t)
	nowArg := now.Format(time.RFC3339)
	code, stdout, stderr := runCLI(t, "ledger", "sync", "--valkey", vk.Addr, "--postgres", pg.DSN, "--spec", spec, "--now", nowArg)
	if code != ExitOK || !strings.Contains(stdout, "ledger sync: 28 rule-windows, 378 principal rows from this Valkey") {
		t.Fatalf("sync: %d %s %s", code, stdout, stderr)
	}
	code, stdout, stderr = runCLI(t, "ledger", "sync", "--valkey", vk.Addr, "--postgres", pg.DSN, "--now", now.Add(time.Hour).Format(time.RFC3339))
	if code != ExitOK || !strings.Contains(stdout, "; 0 rows new or changed") {
		t.Fatalf("second sync: %d %s %s", code, stdout, stderr)
	}
	for _, format := range []string{"json", "text", "html"} {
		args := []string{"report", "--spec", spec, "--days", "14", "--format", format, "--now", nowArg}
		code, fromValkey, stderr := runCLI(t, append(args, "--valkey", vk.Addr)...)
		if code != ExitOK {
			t.Fatalf("report --valkey: %d %s", code, stderr)
		}
		code, fromPG, stderr := runCLI(t, append(args, "--postgres", pg.DSN)...)
		if code != ExitOK {
			t.Fatalf("report --postgres: %d %s", code, stderr)
		}
		if fromPG != fromValkey {
			t.Fatalf("%s report from PostgreSQL differs from Valkey's:\n%s\n---\n%s", format, fromPG, fromValkey)
		}
		if format == "text" && !strings.Contains(fromPG, "alice@example.com") {
			t.Fatalf("report:\n%s", fromPG)
		}
	}
	// The chargeback export reads the same rows from either ledger.
	from := ledger.DayWindow(ledger.DayOf(now) - 14).Day.String()
	args := []string{"export", "--spec", spec, "--from", from, "--to", ledger.DayOf(now).String(), "--now", nowArg}
	code, focusPG, stderr := runCLI(t, append(args, "--postgres", pg.DSN)...)
	if code != ExitOK {
		t.Fatalf("export: %d %s", code, stderr)
	}
	if _, focusVK, _ := runCLI(t, append(args, "--valkey", vk.Addr)...); focusVK != focusPG {
		t.Fatalf("FOCUS export from PostgreSQL differs from Valkey's:\n%s\n---\n%s", focusPG, focusVK)
	}
	// 26 principals of per-human and the fleet's shared bucket, 14 days, and a header.
	if lines := strings.Count(focusPG, "\n"); lines != 14*27+1 || !strings.Contains(focusPG, `"{""budgetgen/budget"":""per-human"",""budgetgen/budget-set"":""ai-budgets"",""budgetgen/principal"":""alice@example.com""}"`) ||
		!strings.Contains(focusPG, ",2500000,Tokens,") {
		t.Fatalf("FOCUS export (%d lines):\n%s", lines, focusPG)
	}
	// Usage errors: no destination, two sources, a password in the DSN.
	for _, args := range [][]string{
		{"ledger", "sync", "--valkey", vk.Addr},
		{"ledger", "sync", "--valkey", vk.Addr, "--service", "http://127.0.0.1:1", "--postgres", pg.DSN},
		{"ledger", "sync", "--valkey", vk.Addr, "--postgres", "postgres://u:secret@127.0.0.1:1/db"},
		{"report", "--valkey", vk.Addr, "--postgres", pg.DSN},
		{"export", "--postgres", pg.DSN, "--format", "parquet"},
		{"export", "--postgres", pg.DSN, "--from", "2026-11-10", "--to", "2026-11-01"},
		{"export", "--postgres", pg.DSN, "--period", "week"},
	} {
		if code, _, stderr := runCLI(t, args...); code != ExitUsage || strings.Contains(stderr, "secret") {
			t.Errorf("%v: code %d %s", args, code, stderr)
		}
	}
}

// TestLedgerSyncRefusesANewerSchema: a durable ledger a newer budgetgen
// migrated fails the sync (exit 1) with a message saying so, before
// anything is read or written.
func TestLedgerSyncRefusesANewerSchema(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := context.Background()
	if code, _, stderr := runCLI(t, "ledger", "sync", "--service", "http://127.0.0.1:1", "--postgres", pg.DSN); code != ExitFailure || !strings.Contains(stderr, "the service at") {
		t.Fatalf("first sync (creates the schema, then fails to read): %d %s", code, stderr)
	}
	pg.Psql(ctx, t, "INSERT INTO budgetgen_ledger_version (version_id, is_applied) VALUES (99, true)")
	code, _, stderr := runCLI(t, "ledger", "sync", "--service", "http://127.0.0.1:1", "--postgres", pg.DSN)
	if code != ExitFailure || !strings.Contains(stderr, "the ledger schema is newer than this budgetgen: it is at version 99") {
		t.Fatalf("sync into a newer schema: %d %s", code, stderr)
	}
}

// TestLedgerSyncReportsALongOutage: when the previous sync from the same
// ledger is older than the ledger's retention, windows expired from Valkey
// before any sync copied them: the sync still copies what is left, and
// fails (exit 1) saying since when PostgreSQL may lack usage. The next run,
// an hour later, succeeds again.
func TestLedgerSyncReportsALongOutage(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	pg := pgtest.Start(t)
	t0 := time.Date(2026, 11, 2, 10, 17, 0, 0, time.UTC)
	sync := func(at time.Time, extra ...string) (int, string, string) {
		return runCLI(t, append([]string{"ledger", "sync", "--valkey", vk.Addr, "--postgres", pg.DSN, "--now", at.Format(time.RFC3339)}, extra...)...)
	}
	for _, at := range []time.Time{t0, t0.Add(10 * 24 * time.Hour)} {
		if code, stdout, stderr := sync(at); code != ExitOK {
			t.Fatalf("sync at %s: %d %s %s", at, code, stdout, stderr)
		}
	}
	late := t0.Add(20*24*time.Hour + time.Hour)
	code, stdout, stderr := sync(late)
	if code != ExitFailure || !strings.Contains(stdout, "ledger sync: 0 rule-windows") ||
		!strings.Contains(stderr, "the previous sync from this ledger committed at 2026-11-12T10:17:00Z, 10d1h0m0s before this one, longer than its retention of 10 days") {
		t.Fatalf("sync after an outage longer than the retention: %d %s %s", code, stdout, stderr)
	}
	if code, stdout, stderr := sync(late.Add(time.Hour)); code != ExitOK {
		t.Fatalf("the next sync: %d %s %s", code, stdout, stderr)
	}
	// A service keeping 30 days: the same outage lost nothing.
	if code, stdout, stderr := sync(late.Add(12*24*time.Hour), "--retention-days", "30"); code != ExitOK {
		t.Fatalf("sync with --retention-days 30: %d %s %s", code, stdout, stderr)
	}
}

// TestServiceURLPasswordRefused: a --service URL with a password is refused
// (exit 2) without echoing it, as a DSN with one is: the URL was quoted in
// every message naming the ledger (budgetgen's own do not redact it) and
// would show in process listings.
func TestServiceURLPasswordRefused(t *testing.T) {
	for _, args := range [][]string{
		{"ledger", "sync", "--service", "http://u:s3cret@127.0.0.1:1", "--postgres", "postgres://u@127.0.0.1:1/db"},
		{"report", "--service", "http://u:s3cret@127.0.0.1:1"},
		{"export", "--service", "https://u:s3cret@127.0.0.1:1/", "--format", "csv"},
		{"report", "--service", "http://u:s3%63ret@127.0.0.1:1"},
		{"report", "--service", "http://u:s3cret x@127.0.0.1:1"}, // net/url refuses it, quoting it
	} {
		if code, stdout, stderr := runCLI(t, args...); code != ExitUsage || strings.Contains(stdout+stderr, "s3cret") || strings.Contains(stdout+stderr, "s3%63ret") ||
			!strings.Contains(stderr, "--service URL holds a password") {
			t.Errorf("%v: %d %s %s", args, code, stdout, stderr)
		}
	}
}

// TestLedgerSyncWithAndWithoutSpec: for a service without a budget map, a
// sync with --spec names an Envoy Gateway rule's rows by their budget, and a
// sync without it (a manual run beside the CronJob) leaves those names.
func TestLedgerSyncWithAndWithoutSpec(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	pg := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{vk.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	now := (ledger.DayOf(time.Now()) + 1).Start().Add(9 * time.Hour)
	lv := ledger.NewValkey(c, "")
	rec, err := ledger.NewRecorder(ledger.Options{}, lv, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	rule := ledger.RuleID{Domain: "ai-gateway/ai-budgets-agent-router", Rule: "ai-gateway/ai-budgets-agent-router/rule/0"}
	if err := lv.Add(ctx, rec.Usage(rule, "alice@example.com", now, 1000)); err != nil {
		t.Fatal(err)
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	spec := copyExample(t)
	const q = "SELECT budget_set || ',' || budget FROM ledger_usage UNION ALL SELECT budget_set || ',' || budget FROM ledger_windows"
	for _, step := range []struct {
		spec bool
		want string
	}{{false, ",ai-gateway/ai-budgets-agent-router/rule/0\n,ai-gateway/ai-budgets-agent-router/rule/0"}, {true, "ai-budgets,per-human\nai-budgets,per-human"}, {false, "ai-budgets,per-human\nai-budgets,per-human"}} {
		args := []string{"ledger", "sync", "--valkey", vk.Addr, "--postgres", pg.DSN, "--now", now.Format(time.RFC3339)}
		if step.spec {
			args = append(args, "--spec", spec)
		}
		if code, stdout, stderr := runCLI(t, args...); code != ExitOK {
			t.Fatalf("%v: %d %s %s", args, code, stdout, stderr)
		}
		if got := pg.Psql(ctx, t, q); got != step.want {
			t.Fatalf("after a sync with --spec %t: %q, want %q", step.spec, got, step.want)
		}
	}
}

// TestLedgerSyncIdentityIgnoresSeedOrder: the durable ledger's record of
// syncs (ledger_syncs.source) names a Valkey by its seeds whatever their
// order or repetition, so reordering --valkey does not look like a new
// ledger whose first sync skips the gap check; a single address keeps the
// identity earlier budgetgen versions recorded, byte for byte.
func TestLedgerSyncIdentityIgnoresSeedOrder(t *testing.T) {
	cl := valkeytest.StartCluster(t, 3)
	if err := cl.WaitOK(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	pg := pgtest.Start(t)
	ctx := context.Background()
	a, b := cl.Addrs[0], cl.Addrs[1]
	t0 := time.Date(2026, 11, 2, 10, 17, 0, 0, time.UTC)
	sync := func(at time.Time, seeds string) (int, string, string) {
		return runCLI(t, "ledger", "sync", "--valkey", seeds, "--postgres", pg.DSN, "--now", at.Format(time.RFC3339))
	}
	if code, stdout, stderr := sync(t0, b+","+a); code != ExitOK {
		t.Fatalf("first sync: %d %s %s", code, stdout, stderr)
	}
	code, stdout, stderr := sync(t0.Add(11*24*time.Hour), a+","+b+","+a)
	if code != ExitFailure || !strings.Contains(stderr, "windows expired from the ledger before a sync copied them") {
		t.Fatalf("sync with the seeds reordered, after the retention: %d %s %s", code, stdout, stderr)
	}
	if code, stdout, stderr := sync(t0, a); code != ExitOK {
		t.Fatalf("single-address sync: %d %s %s", code, stdout, stderr)
	}
	lo, hi := a, b
	if hi < lo {
		lo, hi = hi, lo
	}
	got := pg.Psql(ctx, t, "SELECT string_agg(source, '|' ORDER BY source) FROM ledger_syncs")
	want := []string{fmt.Sprintf(`valkey %s prefix ""`, a), fmt.Sprintf(`valkey %s,%s prefix ""`, lo, hi)}
	sort.Strings(want)
	if got != strings.Join(want, "|") {
		t.Fatalf("ledger_syncs sources:\n%s\nwant\n%s", got, strings.Join(want, "|"))
	}
}

// TestLedgerSyncSaysAuthenticationFailed: a wrong PostgreSQL password fails
// the sync (exit 1) saying authentication failed, not that the server is
// unreachable, without printing the password.
func TestLedgerSyncSaysAuthenticationFailed(t *testing.T) {
	pg := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg.AddPasswordRole(ctx, t, "ledgersync", "right-pw")
	t.Setenv("PGPASSWORD", "Wr0ngSecret")
	dsn := fmt.Sprintf("postgres://ledgersync@127.0.0.1:%d/postgres?sslmode=disable", pg.Port)
	code, stdout, stderr := runCLI(t, "ledger", "sync", "--service", "http://127.0.0.1:1", "--postgres", dsn)
	if code != ExitFailure || !strings.Contains(stderr, "authentication failed") || strings.Contains(stderr, "unreachable") ||
		strings.Contains(stdout+stderr, "Wr0ngSecret") {
		t.Fatalf("sync with a wrong password: %d %s %s", code, stdout, stderr)
	}
}

// TestLedgerSyncCopiesWhatABoundedScanFinds: a Valkey with more ledger keys
// than --max-keys (5M by default) no longer stops every sync: the run copies
// the rule-windows it listed, commits them, and exits 1 saying the scan
// stopped on which node and that the rest was not copied.
func TestLedgerSyncCopiesWhatABoundedScanFinds(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	pg := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{vk.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	now := shadowFortnight(t, ctx, c)
	code, stdout, stderr := runCLI(t, "ledger", "sync", "--valkey", vk.Addr, "--postgres", pg.DSN, "--now", now.Format(time.RFC3339), "--max-keys", "5")
	if code != ExitFailure || !strings.Contains(stdout, "ledger sync: ") || strings.Contains(stdout, "ledger sync: 0 rule-windows") ||
		!strings.Contains(stderr, "the rule-windows of the keys past it were not copied") || !strings.Contains(stderr, "scan ledger keys on "+vk.Addr) ||
		strings.Contains(stderr, "nothing was written") {
		t.Fatalf("sync over --max-keys: %d %s %s", code, stdout, stderr)
	}
	if got := pg.Psql(ctx, t, "SELECT count(*) > 0 FROM ledger_windows"); got != "t" {
		t.Fatalf("nothing committed: %s", got)
	}
	if code, _, stderr := runCLI(t, "ledger", "sync", "--valkey", vk.Addr, "--postgres", pg.DSN, "--max-keys", "0"); code != ExitUsage {
		t.Fatalf("--max-keys 0: %d %s", code, stderr)
	}
}
