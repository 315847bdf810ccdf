// Package report holds an example shadow-week report for the main example
// spec (../budgets.yaml) and the test that regenerates it: a deterministic
// week of ledger rows, named exactly as the rate limit service names them,
// served the way the service's debug port serves its embedded ledger, and
// read by `budgetgen report --include-today` with an injected clock.
//
//	go test ./examples/report            # fails on any byte of difference
//	go test ./examples/report -update    # rewrite the committed reports
package report

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/cli"
	"github.com/budgetgen/budgetgen/internal/ledger"
)

var update = flag.Bool("update", false, "rewrite the committed reports from the fixture")

// The shadow week: budgets in shadow since 2026-10-16 (the spec's
// shadowSince, a partial day that promote does not count); the report runs on
// 2026-10-24 at 15:00 UTC, so the window is the 7 full shadow days
// 2026-10-17..2026-10-23 and today is partial.
var (
	firstDay = time.Date(2026, 10, 17, 0, 0, 0, 0, time.UTC)
	now      = time.Date(2026, 10, 24, 15, 0, 0, 0, time.UTC)
)

const (
	egDomain  = "ai-gateway/ai-budgets-agent-router"
	agwDomain = "agents/ai-budgets-agent-gateway"
)

// formats are the committed files and the --format that writes each.
var formats = map[string]string{
	"report.md":   "markdown",
	"report.json": "json",
	"report.html": "html",
	"report.txt":  "text",
}

func TestExampleReportIsCurrent(t *testing.T) {
	mem := fixture(t)
	mux := http.NewServeMux()
	mux.Handle("/ledger/", ledger.Handler(mem))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for file, format := range formats {
		var stdout, stderr bytes.Buffer
		args := []string{"report", "--service", srv.URL, "--spec", "../budgets.yaml", "--include-today",
			"--now", now.Format(time.RFC3339), "--format", format}
		if code := cli.Run(context.Background(), args, strings.NewReader(""), &stdout, &stderr); code != 0 {
			t.Fatalf("budgetgen %s: exit %d\n%s", strings.Join(args, " "), code, stderr.String())
		}
		got := stdout.Bytes()
		if *update {
			if err := os.WriteFile(file, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("%v (run go test ./examples/report -update)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what budgetgen report writes now (run go test ./examples/report -update and review the diff)", file)
		}
	}

	// What the example is there to show, so a regenerated file still shows it.
	md, _ := os.ReadFile("report.md")
	for _, want := range []string{
		"2026-10-24", "partial", // today so far
		"alice@example.com", "run-1019-loop", "key-07", // principals over their caps
		"acme-batch", "trial-42", // override populations, each against its own cap
		"budgetgen/no-claim",      // calls without an identity header: one principal of each budget
		"agent-fleet", "frontier", // shared buckets
		"Reservations (reserve auto)", // per-run and per-human reserve
	} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("report.md does not show %q", want)
		}
	}
}

// fixture fills an embedded-store ledger with the shadow week. Every row is
// named by ledger.FromDescriptor from the descriptor the gateway sends and
// the rate limit config matches (free marks the entries whose value came
// from the request), as the service does; would-be 429s are counted per
// rule, day and principal as the service's shadow decisions count them.
func fixture(t *testing.T) *ledger.Memory {
	t.Helper()
	clock := func() time.Time { return now }
	w := &shadowWeek{mem: ledger.NewMemory("", clock), rng: rand.New(rand.NewPCG(2026, 1016))} // fixed seed: the same week every run
	var err error
	if w.rec, err = ledger.NewRecorder(ledger.Options{}, w.mem, clock); err != nil {
		t.Fatal(err)
	}
	for d := 0; d <= 7; d++ { // day 7 is today, until 15:00
		day := firstDay.AddDate(0, 0, d)
		share := uint64(100) // percent of a full day's traffic
		switch {
		case d == 7:
			share = 60
		case day.Weekday() == time.Saturday || day.Weekday() == time.Sunday:
			share = 40
		}
		w.scaled = func(n uint64) uint64 { return n * share / 100 }
		w.agentgatewayDay(d, day)
		w.envoyDay(d, day)
	}
	if err := w.rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	return w.mem
}

// shadowWeek writes the week's ledger rows.
type shadowWeek struct {
	mem    *ledger.Memory
	rec    *ledger.Recorder
	rng    *rand.Rand
	scaled func(uint64) uint64 // a full day's traffic to the day's share
}

func (w *shadowWeek) between(lo, hi uint64) uint64 { return lo + w.rng.Uint64N(hi-lo+1) }

func (w *shadowWeek) use(domain string, entries []*rlcommon.RateLimitDescriptor_Entry, free uint64, at time.Time, tokens, callTokens, limit uint64) {
	rule, principal := ledger.FromDescriptor(domain, "", entries, free)
	u := w.rec.Usage(rule, principal, at, tokens)
	w.mem.HIncrBy(u.Key, u.Field, u.Tokens)
	// Each call after the bucket passed its cap would have been a 429.
	if tokens > limit {
		for range (tokens-limit)/callTokens + 1 {
			w.rec.DeniedIn(rule, ledger.WindowAt(ledger.PeriodDay, at, nil), ledger.Denial{Principal: principal, Shadow: true})
		}
	}
}

// reserving is use for a budget that reserves (the spec's reserve: auto):
// each admitted call held about its size (the 95th percentile the service
// learns, here 6/5 of a call), a call over the cap held nothing, and lost
// calls (a client that reset mid-stream) left holds that expired. A
// principal going over its cap was also denied once just before it, by the
// holds of its own calls in flight: a would-be 429 due to reservations alone.
func (w *shadowWeek) reserving(domain string, entries []*rlcommon.RateLimitDescriptor_Entry, free uint64, at time.Time, tokens, callTokens, limit uint64, lost uint64) {
	w.use(domain, entries, free, at, tokens, callTokens, limit)
	rule, principal := ledger.FromDescriptor(domain, "", entries, free)
	day := ledger.WindowAt(ledger.PeriodDay, at, nil)
	calls := (tokens + callTokens - 1) / callTokens
	if tokens > limit {
		calls -= min(calls, (tokens-limit)/callTokens+1)
		w.rec.DeniedIn(rule, day, ledger.Denial{Principal: principal, Shadow: true, Reserve: true})
	}
	reserve := callTokens * 6 / 5
	w.rec.HoldsIn(rule, day, ledger.Holds{Count: calls + lost, Held: (calls + lost) * reserve, Expired: lost * reserve})
}

func entry(k, v string) *rlcommon.RateLimitDescriptor_Entry {
	return &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v}
}

// egRule is the descriptor Envoy Gateway sends for rule i of the policy.
func egRule(i int, matches ...string) []*rlcommon.RateLimitDescriptor_Entry {
	r := fmt.Sprintf("%s/rule/%d", egDomain, i)
	es := []*rlcommon.RateLimitDescriptor_Entry{entry(r, r)}
	for m, v := range matches {
		k := fmt.Sprintf("rule-%d-match-%d", i, m)
		if v == "" {
			v = k // header_value_match: key = value
		}
		es = append(es, entry(k, v))
	}
	return es
}

// agentgatewayDay: B1 per-run (agentgateway, 5M per run): runs live for a
// day; one loops on 10-19, one retries too often on 10-21, one loops today.
// B2 agent-fleet (one 200M bucket): the same calls, plus the fleet's calls
// that carry no run (scheduled agents). per-run reserves; run-1021-retry
// leaves three holds to expire.
func (w *shadowWeek) agentgatewayDay(d int, day time.Time) {
	at, tag := day.Add(10*time.Hour), day.Format("0102")
	var fleet uint64
	runs := int(w.scaled(40))
	for i := range runs {
		tok := w.between(200_000, 3_500_000)
		fleet += tok
		w.reserving(agwDomain, []*rlcommon.RateLimitDescriptor_Entry{entry("budget", "per-run"), entry("principal", fmt.Sprintf("run-%s-%02d", tag, i))}, 0b10, at, tok, 250_000, 5_000_000, 0)
	}
	for run, tok := range map[string]uint64{"run-1019-loop": 11_400_000, "run-1021-retry": 6_500_000, "run-1024-loop": 7_200_000} {
		if strings.HasPrefix(run, "run-"+tag) {
			fleet += tok
			lost := uint64(0)
			if run == "run-1021-retry" {
				lost = 3 // the retries it gave up on mid-stream
			}
			w.reserving(agwDomain, []*rlcommon.RateLimitDescriptor_Entry{entry("budget", "per-run"), entry("principal", run)}, 0b10, at, tok, 250_000, 5_000_000, lost)
		}
	}
	fleet += w.scaled(w.between(60_000_000, 120_000_000))
	w.use(agwDomain, []*rlcommon.RateLimitDescriptor_Entry{entry("budget", "agent-fleet"), entry("group", "agent")}, 0, at, fleet, 250_000, 200_000_000)
}

// envoyDay: B3 per-human (Envoy Gateway rule 0, 2M): alice goes over on two
// days. B4 per-api-key (rule 2, 1M; the override principals excluded):
// key-07 goes over from 10-22; overrides acme-batch (rule 3, 20M) over once,
// trial-42 (rule 4, 100k) over from 10-23. Calls with neither identity header
// (a verified token without the email claim) are charged to each budget's
// unidentified requests' rule, principal budgetgen/no-claim: per-human's
// (rule 1, 2M) and per-api-key's (rule 5, 1M), which they pass on 10-22. B5
// frontier (rule 6, one 50M bucket): over on 10-20.
func (w *shadowWeek) envoyDay(d int, day time.Time) {
	at := day.Add(10 * time.Hour)
	for i := 1; i <= 25; i++ {
		w.reserving(egDomain, egRule(0, fmt.Sprintf("user%02d@example.com", i)), 0b10, at, w.scaled(w.between(50_000, 1_600_000)), 40_000, 2_000_000, 0)
	}
	alice := w.scaled(1_100_000)
	if d == 1 || d == 3 || d == 7 {
		alice = map[int]uint64{1: 2_400_000, 3: 2_900_000, 7: 2_150_000}[d]
	}
	w.reserving(egDomain, egRule(0, "alice@example.com"), 0b10, at, alice, 40_000, 2_000_000, 0)
	for i := 1; i <= 20; i++ {
		tok := w.scaled(w.between(50_000, 800_000))
		if i == 7 && d >= 5 {
			tok = map[int]uint64{5: 1_300_000, 6: 1_450_000, 7: 1_050_000}[d]
		}
		w.use(egDomain, egRule(2, fmt.Sprintf("key-%02d", i), "", ""), 0b10, at, tok, 20_000, 1_000_000)
	}
	acme := w.between(14_000_000, 18_000_000)
	if d == 4 {
		acme = 22_000_000
	}
	if d == 7 {
		acme = 0 // nightly batch: today's run has not started
	}
	if acme > 0 {
		w.use(egDomain, egRule(3, ""), 0, day.Add(2*time.Hour), acme, 500_000, 20_000_000)
	}
	trial := w.scaled(w.between(40_000, 90_000))
	if d >= 6 {
		trial = map[int]uint64{6: 140_000, 7: 120_000}[d]
	}
	w.use(egDomain, egRule(4, ""), 0, at, trial, 5_000, 100_000)
	frontier := w.scaled(w.between(30_000_000, 48_000_000))
	if d == 3 {
		frontier = 56_000_000
	}
	w.use(egDomain, egRule(6, ""), 0, at, frontier, 400_000, 50_000_000)
	// Not drawn from rng, so the other principals' numbers stay as they were.
	unidentified := w.scaled(300_000 + 40_000*uint64(d))
	if d == 5 {
		unidentified = 1_240_000
	}
	w.use(egDomain, egRule(1, "", ""), 0, at, unidentified, 20_000, 2_000_000)
	w.use(egDomain, egRule(5, "", ""), 0, at, unidentified, 20_000, 1_000_000)
}

// TestPromoteAgreesWithTheExample: the example's verdicts are the ones
// `budgetgen promote --evidence report.json` reaches on the same day: a
// budget the report calls ready is promoted, any other is refused.
func TestPromoteAgreesWithTheExample(t *testing.T) {
	raw, err := os.ReadFile("report.json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Budgets []struct {
			Name    string `json:"name"`
			Verdict struct {
				Status string `json:"status"`
			} `json:"verdict"`
		} `json:"budgets"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile("../budgets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ready := 0
	for _, b := range rep.Budgets {
		path := filepath.Join(t.TempDir(), "budgets.yaml")
		if err := os.WriteFile(path, spec, 0o644); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		args := []string{"promote", b.Name, "--spec", path, "--evidence", "report.json", "--now", now.Format(time.RFC3339)}
		code := cli.Run(context.Background(), args, strings.NewReader(""), &stdout, &stderr)
		if promoted := code == 0; promoted != (b.Verdict.Status == "ready") {
			t.Errorf("%s: report says %s, promote exit %d: %s", b.Name, b.Verdict.Status, code, stderr.String())
		}
		if b.Verdict.Status == "ready" {
			ready++
		}
	}
	if ready == 0 || ready == len(rep.Budgets) {
		t.Errorf("%d of %d budgets ready: the example should show both verdicts", ready, len(rep.Budgets))
	}
}
