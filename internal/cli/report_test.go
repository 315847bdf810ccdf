package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/report"
	"github.com/budgetgen/budgetgen/internal/schedtest"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// fiveDays writes 5 days of per-run (agentgateway) usage, a runaway over its
// cap every day, and today so far; it returns the report's clock. Valkey
// expires on its own clock: the days start tomorrow.
func fiveDays(t *testing.T, ctx context.Context, c valkey.Client) time.Time {
	t.Helper()
	day0 := ledger.DayOf(time.Now()) + 1
	now := (day0 + 5).Start().Add(9 * time.Hour)
	lv := ledger.NewValkey(c, "")
	rec, _ := ledger.NewRecorder(ledger.Options{}, lv, func() time.Time { return now })
	// per-run (B1) runs on agentgateway: without a budget map the service names
	// its rows by the domain and the descriptor's budget entry.
	perRun := ledger.RuleID{Domain: "agents/ai-budgets-agent-gateway", Rule: "per-run"}
	var us []ledger.Usage
	for i := 0; i < 5; i++ { // 5 days of data only
		at := (day0 + ledger.Day(i)).Start().Add(time.Hour)
		for p := 0; p < 4; p++ {
			us = append(us, rec.Usage(perRun, fmt.Sprintf("run-%d", p), at, uint64(1_000_000*(p+1))))
		}
		us = append(us, rec.Usage(perRun, "runaway", at, 9_000_000))
		rec.Denied(perRun, at, true)
	}
	// Today so far: the runaway is over again.
	us = append(us, rec.Usage(perRun, "runaway", now.Add(-time.Hour), 6_000_000))
	if err := lv.Add(ctx, us...); err != nil {
		t.Fatal(err)
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	return now
}

func TestReportCLI(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	now := fiveDays(t, ctx, c)
	spec := copyExample(t)
	nowArg := now.Format(time.RFC3339)

	code, stdout, stderr := runCLI(t, "report", "--valkey", srv.Addr, "--spec", spec, "--format", "json", "--budget", "per-run", "--now", nowArg)
	if code != ExitOK {
		t.Fatalf("code %d: %s", code, stderr)
	}
	var r report.Report
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Budgets) != 1 {
		t.Fatalf("budgets %+v", r.Budgets)
	}
	b := r.Budgets[0].Caps[0]
	// 5 principals a day over 5 days; the runaway (9M) is over the 5M cap every day.
	if r.Budgets[0].Name != "per-run" || b.Cap != 5_000_000 || b.DaysCovered != 5 || b.Summary.PrincipalWindows != 25 || b.Summary.OverCap != 5 ||
		b.Summary.AboveCap != 5*4_000_000 || b.Summary.Would429 != 5 || b.Summary.Max != 9_000_000 || b.Summary.Principals != 5 {
		t.Fatalf("per-run %+v", b)
	}
	if !strings.Contains(stderr, "measured on 5 of 7 days") {
		t.Fatalf("fewer than 7 days should be said: %s", stderr)
	}

	if len(b.OverCapPrincipals) != 1 || b.OverCapPrincipals[0].Principal != "runaway" || len(b.OverCapPrincipals[0].WindowsOver) != 5 || r.PartialDay != "" {
		t.Fatalf("over-cap principals %+v", b.OverCapPrincipals)
	}
	// --include-today: today is the partial last day; --top bounds the list.
	code, stdout, stderr = runCLI(t, "report", "--valkey", srv.Addr, "--spec", spec, "--format", "json", "--budget", "per-run", "--include-today", "--top", "1", "--headroom", "1.5", "--now", nowArg)
	if code != ExitOK {
		t.Fatalf("include-today: %d %s", code, stderr)
	}
	r = report.Report{}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	b = r.Budgets[0].Caps[0]
	if last := b.PerWindow[len(b.PerWindow)-1]; r.PartialDay != now.Format("2006-01-02") || !last.Partial || last.Max != 6_000_000 ||
		len(b.OverCapPrincipals[0].WindowsOver) != 6 || r.TopN != 1 || r.Headroom != 1.5 || b.SuggestedCap != 14_000_000 {
		t.Fatalf("include-today: %+v", r)
	}
	// A window with nothing in it but today: says why, not zeros.
	firstDay := now.AddDate(0, 0, -5).Format(time.RFC3339) // the first day of data, at 09:00
	code, stdout, stderr = runCLI(t, "report", "--valkey", srv.Addr, "--spec", spec, "--budget", "per-run", "--now", firstDay)
	if code != ExitOK || !strings.Contains(stderr, "use --include-today") || !strings.Contains(stdout, "use --include-today") || strings.Contains(stdout, "suggested cap: 0") {
		t.Fatalf("empty window: %d\n%s\n%s", code, stdout, stderr)
	}

	// -o writes the file, with {to} as the window's last day.
	out := filepath.Join(t.TempDir(), "week-{to}.json")
	code, stdout, stderr = runCLI(t, "report", "--valkey", srv.Addr, "--spec", spec, "--format", "json", "-o", out, "--now", nowArg)
	written := strings.ReplaceAll(out, "{to}", r.To)
	if b, err := os.ReadFile(written); code != ExitOK || stdout != "" || err != nil || !json.Valid(b) || !strings.Contains(stderr, "wrote "+written) {
		t.Fatalf("-o: %d %v %s", code, err, stderr)
	}

	code, stdout, _ = runCLI(t, "report", "--valkey", srv.Addr, "--spec", spec, "--format", "html", "--now", nowArg)
	if code != ExitOK || !strings.Contains(stdout, `<section class="budget" id="budget-per-run">`) || !strings.Contains(stdout, `<svg class="chart" data-chart="histogram"`) {
		t.Fatalf("html: %d", code)
	}

	checkReportErrors(t, srv.Addr, spec, nowArg)
}

// checkReportErrors: an unknown budget, an unreachable Valkey and usage
// errors, each with a clear message and its exit code.
func checkReportErrors(t *testing.T, addr, spec, nowArg string) {
	t.Helper()
	code, _, stderr := runCLI(t, "report", "--valkey", addr, "--spec", spec, "--budget", "per-rnu", "--now", nowArg)
	if code != ExitFailure || !strings.Contains(stderr, `unknown budget "per-rnu"`) || !strings.Contains(stderr, "per-run") {
		t.Fatalf("unknown budget: %d %s", code, stderr)
	}

	// Unreachable Valkey: a clear message, quickly (5 s plus the scheduler's
	// worst lag in this run, for the 500 ms dial timeout).
	lag := schedtest.Start()
	start := time.Now()
	dead := fmt.Sprintf("127.0.0.1:%d", valkeytest.FreePort(t))
	code, _, stderr = runCLI(t, "report", "--valkey", dead, "--dial-timeout", "500ms")
	if code != ExitFailure || !strings.Contains(stderr, "valkey "+dead+" unreachable") {
		t.Fatalf("unreachable: %d %s", code, stderr)
	}
	took := time.Since(start)
	if _, lagMax := lag.Stop(); took > 5*time.Second+lagMax {
		t.Fatalf("unreachable took %s (bound 5 s + scheduler lag %v)", took, lagMax)
	}

	// Usage errors.
	for _, args := range [][]string{{"report"}, {"report", "--valkey", addr, "--format", "yaml"}, {"report", "--valkey", addr, "--days", "0"},
		{"report", "--valkey", addr, "--headroom", "1"}, {"report", "--valkey", addr, "--top", "0"},
		{"report", "--valkey", addr, "--time-zone", "Mars/Olympus"}, {"report", "--valkey", addr, "--time-zone", "Local"}, {"report", "--valkey", addr, "--max-limited-share", "1"}} {
		if code, _, _ := runCLI(t, args...); code != ExitUsage {
			t.Errorf("%v: code %d", args, code)
		}
	}
}

// The report reads a cluster through any one node.
func TestReportCLICluster(t *testing.T) {
	cl := valkeytest.StartCluster(t, 3)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: cl.Addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	day := ledger.DayOf(time.Now()) + 1
	now := (day + 1).Start().Add(time.Hour)
	lv := ledger.NewValkey(c, "")
	rec, _ := ledger.NewRecorder(ledger.Options{}, lv, func() time.Time { return now })
	d := "ai-gateway/ai-budgets-agent-router"
	var us []ledger.Usage
	// per-run (agentgateway), per-human (rule 0), per-api-key's acme-batch
	// override (rule 3, whose bucket is that one principal): hash tags in
	// slots 9888, 2034 and 14225, one on each node of a three-master cluster.
	for i, r := range []ledger.RuleID{{Domain: "agents/ai-budgets-agent-gateway", Rule: "per-run"}, {Domain: d, Rule: d + "/rule/0"}, {Domain: d, Rule: d + "/rule/3"}} {
		for p := 0; p < 3; p++ {
			principal := fmt.Sprintf("p%d", p)
			if i == 2 {
				principal = "acme-batch"
			}
			us = append(us, rec.Usage(r, principal, day.Start(), uint64(1000*(i+1))))
		}
	}
	if err := lv.Add(ctx, us...); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, "report", "--valkey", cl.Addrs[1], "--spec", copyExample(t), "--days", "1", "--format", "json", "--now", now.Format(time.RFC3339))
	if code != ExitOK {
		t.Fatalf("%d %s", code, stderr)
	}
	var r report.Report
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, b := range r.Budgets {
		got[b.Name] = b.Caps[0].Summary.Total
		for _, o := range b.Caps[0].Overridden {
			got[b.Name+"/"+o.Principal] = o.Summary.Total
		}
	}
	if got["per-run"] != 3000 || got["per-human"] != 6000 || got["per-api-key/acme-batch"] != 9000 {
		t.Fatalf("totals %v", got)
	}
}

// TestReportCLIFromService: the embedded store's ledger read from a
// service's debug port (ledger.Handler, as the service mounts it) gives the
// report the Valkey ledger would.
func TestReportCLIFromService(t *testing.T) {
	day0 := ledger.DayOf(time.Now()) - 3
	now := (day0 + 3).Start().Add(9 * time.Hour)
	clock := func() time.Time { return now }
	mem := ledger.NewMemory("", clock)
	rec, _ := ledger.NewRecorder(ledger.Options{}, mem, clock)
	// per-run (B1) runs on agentgateway: without a budget map the service names
	// its rows by the domain and the descriptor's budget entry.
	perRun := ledger.RuleID{Domain: "agents/ai-budgets-agent-gateway", Rule: "per-run"}
	for i := 0; i < 3; i++ {
		at := (day0 + ledger.Day(i)).Start().Add(time.Hour)
		for p := 0; p < 3; p++ {
			u := rec.Usage(perRun, fmt.Sprintf("run-%d", p), at, uint64(1_000_000*(p+1)))
			mem.HIncrBy(u.Key, u.Field, u.Tokens)
		}
		u := rec.Usage(perRun, "runaway", at, 9_000_000)
		mem.HIncrBy(u.Key, u.Field, u.Tokens)
		rec.Denied(perRun, at, true)
	}
	if err := rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ledger/", ledger.Handler(mem))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	spec := copyExample(t)
	code, stdout, stderr := runCLI(t, "report", "--service", srv.URL, "--spec", spec, "--format", "json", "--budget", "per-run", "--now", now.Format(time.RFC3339))
	if code != ExitOK {
		t.Fatalf("code %d: %s", code, stderr)
	}
	var r report.Report
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Budgets) != 1 || r.Budgets[0].Caps[0].DaysCovered != 3 || r.Budgets[0].Caps[0].Summary.PrincipalWindows != 12 ||
		r.Budgets[0].Caps[0].Summary.OverCap != 3 || r.Budgets[0].Caps[0].Summary.Would429 != 3 {
		t.Fatalf("report %+v", r.Budgets)
	}
	// Usage errors and a service that serves no ledger.
	for _, args := range [][]string{
		{"report", "--service", srv.URL, "--valkey", "127.0.0.1:1"},
		{"report", "--service", "127.0.0.1:6070"},
		{"report", "--service", srv.URL, "--prefix", "rl_"},
	} {
		if code, _, _ := runCLI(t, args...); code != ExitUsage {
			t.Errorf("%v: code %d, want usage", args, code)
		}
	}
	plain := httptest.NewServer(http.NotFoundHandler())
	defer plain.Close()
	code, _, stderr = runCLI(t, "report", "--service", plain.URL)
	if code != ExitFailure || !strings.Contains(stderr, "no ledger served there") {
		t.Fatalf("no ledger: %d %s", code, stderr)
	}
}

// report's share flags reject NaN at the command line (exit 2, before any
// store is dialled), as promote's does, instead of after connecting.
func TestReportShareFlagsRejectNaN(t *testing.T) {
	for _, f := range []string{"--max-limited-share", "--target-share"} {
		code, _, stderr := runCLI(t, "report", "--valkey", "127.0.0.1:1", f, "NaN")
		if code != ExitUsage || !strings.Contains(stderr, f+" NaN: must be within (0, 1)") {
			t.Errorf("%s NaN: code %d stderr %s", f, code, stderr)
		}
	}
}
