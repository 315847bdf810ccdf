package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func copyExample(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../examples/budgets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "budgets.yaml")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPromoteDemoteCLI(t *testing.T) {
	p := copyExample(t)
	before, _ := os.ReadFile(p)

	// Day 6 of shadow (shadowSince 2026-10-16): refused, exit 1, file untouched.
	code, _, stderr := runCLI(t, "promote", "per-run", "--spec", p, "--now", "2026-10-22T12:00:00Z")
	if code != ExitFailure || !strings.Contains(stderr, "refused") || !strings.Contains(stderr, "5 of 7 full UTC days") {
		t.Fatalf("day 6: code %d stderr %s", code, stderr)
	}
	if now, _ := os.ReadFile(p); !bytes.Equal(now, before) {
		t.Fatal("refused promotion changed the file")
	}
	// Usage errors.
	if code, _, _ := runCLI(t, "promote", "per-run"); code != ExitUsage {
		t.Errorf("missing --spec: code %d", code)
	}
	if code, _, _ := runCLI(t, "promote", "per-run", "--spec", p, "--reason", "x"); code != ExitUsage {
		t.Errorf("--reason without --force: code %d", code)
	}
	if code, _, stderr := runCLI(t, "promote", "nope", "--spec", p, "--now", "2026-10-24T00:00:00Z"); code != ExitFailure || !strings.Contains(stderr, "unknown budget") {
		t.Errorf("unknown budget: code %d %s", code, stderr)
	}
	if code, _, stderr := runCLI(t, "promote", "per-run", "--spec", p, "--evidence", filepath.Join(t.TempDir(), "none.json"), "--now", "2026-10-24T00:00:00Z"); code != ExitUsage || !strings.Contains(stderr, "read evidence") {
		t.Errorf("missing evidence: code %d %s", code, stderr)
	}
	// A huge --evidence (the wrong file) is refused without being read whole.
	if code, _, stderr := runCLI(t, "promote", "per-run", "--spec", p, "--evidence", "/dev/zero", "--now", "2026-10-24T00:00:00Z"); code != ExitUsage || !strings.Contains(stderr, "file too large") {
		t.Errorf("endless evidence: code %d %s", code, stderr)
	}

	// Day 8 without --evidence: no measurements were looked at, so it is
	// refused (exit 1, nothing written) unless forced.
	code, _, stderr = runCLI(t, "promote", "per-run", "--spec", p, "--now", "2026-10-24T08:00:00Z")
	if code != ExitFailure || !strings.Contains(stderr, "no measurements were looked at") || !strings.Contains(stderr, "--evidence") || !strings.Contains(stderr, "--force") {
		t.Fatalf("day 8 without evidence: code %d stderr %s", code, stderr)
	}
	if now, _ := os.ReadFile(p); !bytes.Equal(now, before) {
		t.Fatal("a promotion without evidence changed the file")
	}
	// Forced: accepted, with the note on stderr and the reason recorded; only
	// per-run's line changes (mode, the date and the reason, in place).
	code, stdout, stderr := runCLI(t, "promote", "per-run", "--spec", p, "--now", "2026-10-24T08:00:00Z", "--force", "--reason", "no ledger yet")
	if code != ExitOK {
		t.Fatalf("day 8: code %d %s", code, stderr)
	}
	if !strings.Contains(stdout, "promoted to enforce on 2026-10-24 after 7 full days") || !strings.Contains(stderr, "no measurements were looked at") {
		t.Errorf("stdout %s stderr %s", stdout, stderr)
	}
	after, _ := os.ReadFile(p)
	want := strings.Replace(string(before),
		"tokensPerDay: 5000000,   mode: shadow, shadowSince: 2026-10-16, gateways: [agents/agent-gateway], reserve: auto",
		`tokensPerDay: 5000000,   mode: enforce, enforcedSince: 2026-10-24, promotionReason: "no ledger yet", shadowSince: 2026-10-16, gateways: [agents/agent-gateway], reserve: auto`, 1)
	if string(after) != want {
		t.Fatalf("promoted spec:\n%s", after)
	}
	if n := changedLines(string(before), string(after)); n != 1 {
		t.Errorf("promotion changed %d lines, want a one-line diff", n)
	}
	// Demote: back at once.
	code, _, stderr = runCLI(t, "demote", "per-run", "--spec", p, "--now", "2026-10-25T08:00:00Z")
	if code != ExitOK {
		t.Fatalf("demote: %d %s", code, stderr)
	}
	back, _ := os.ReadFile(p)
	wantBack := strings.Replace(string(before), "tokensPerDay: 5000000,   mode: shadow, shadowSince: 2026-10-16, gateways: [agents/agent-gateway], reserve: auto", "tokensPerDay: 5000000,   mode: shadow, shadowSince: 2026-10-25, gateways: [agents/agent-gateway], reserve: auto", 1)
	if string(back) != wantBack {
		t.Fatalf("demoted spec:\n%s", back)
	}
	// Forced promotion of the frontier cap records the reason; the spec still loads.
	code, _, stderr = runCLI(t, "promote", "frontier", "--spec", p, "--now", "2026-10-20T08:00:00Z", "--force", "--reason", "incident 42")
	if code != ExitOK {
		t.Fatalf("forced: %d %s", code, stderr)
	}
	fr, _ := os.ReadFile(p)
	if !strings.Contains(string(fr), `tokensPerDay: 50000000, mode: enforce, enforcedSince: 2026-10-20, promotionReason: "incident 42", shadowSince: 2026-10-16, killSwitch: false}`) {
		t.Fatalf("forced frontier:\n%s", fr)
	}
}

// After promote, render emits shadowMode: false for the promoted budget only,
// and assert accepts the enforcing rule when given the spec (and flags it
// without the spec: nothing else says it was promoted). per-human is rules 0
// and 1 of the Envoy Gateway policy; per-run runs on agentgateway, whose shadow
// flag lives in the rate limit config render writes for its domain.
func TestPromoteThenRenderAndAssert(t *testing.T) {
	p := copyExample(t)
	for _, b := range []string{"per-human", "per-run"} {
		if code, _, stderr := runCLI(t, "promote", b, "--spec", p, "--now", "2026-10-24T08:00:00Z", "--force", "--reason", "test"); code != ExitOK {
			t.Fatalf("promote %s: %s", b, stderr)
		}
	}
	tmp := t.TempDir()
	out, rls := filepath.Join(tmp, "rendered"), filepath.Join(tmp, "ratelimit")
	if code, _, stderr := runCLI(t, "render", p, "-o", out, "--ratelimit-config", rls); code != ExitOK {
		t.Fatalf("render: %s", stderr)
	}
	btp, err := os.ReadFile(filepath.Join(out, "backendtrafficpolicy_ai-gateway_ai-budgets-agent-router.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// per-human's two rules: its principals' and its unidentified requests'
	// (principal budgetgen/no-claim), which promote flips with the budget.
	if n := strings.Count(string(btp), "shadowMode: false"); n != 2 {
		t.Fatalf("%d rules with shadowMode: false, want only per-human's two:\n%s", n, btp)
	}
	if !strings.Contains(string(btp), `"rule":0,"budget":"per-human"`) || !strings.Contains(string(btp), `"rule":1,"budget":"per-human","kind":"tokens","principal":"budgetgen/no-claim"`) {
		t.Fatalf("rules 0 and 1 are not per-human's: %s", btp)
	}
	// agentgateway: per-run's descriptor lost shadow_mode, agent-fleet's kept it.
	agw, err := os.ReadFile(filepath.Join(rls, "agents_ai-budgets-agent-gateway.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	perRun, fleet, ok := strings.Cut(string(agw), "value: agent-fleet")
	if !ok || !strings.Contains(perRun, "value: per-run") || strings.Contains(perRun, "shadow_mode") || !strings.Contains(fleet, "shadow_mode: true") {
		t.Fatalf("agentgateway rate limit config after promoting per-run:\n%s", agw)
	}
	// BG006 needs the SecurityPolicies, which are not part of this spec's output.
	if code, stdout, stderr := runCLI(t, "assert", "--spec", p, "--skip", "BG006", out); code != ExitOK {
		t.Fatalf("assert with the promoted spec: %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr := runCLI(t, "assert", "--skip", "BG006", out)
	if code != ExitFailure || !strings.Contains(stdout+stderr, "BG002") {
		t.Fatalf("assert without the spec should flag the enforcing rule: %d\n%s%s", code, stdout, stderr)
	}
	// agentgateway's modes live in its domain's rate limit config: the gate
	// reads it and compares it with the spec. Promoted spec + promoted
	// config: clean; the spec before the promotion over the same config:
	// per-run's limit has lost shadow_mode (BG020, naming file, line and field).
	if code, stdout, stderr := runCLI(t, "assert", "--spec", p, "--skip", "BG006,BG013", out, rls); code != ExitOK || !strings.Contains(stdout, "ok: 0 errors, 0 warnings") {
		t.Fatalf("assert with the promoted spec and rate limit config: %d\n%s%s", code, stdout, stderr)
	}
	if code, stdout, stderr := runCLI(t, "assert", "--spec", "../../examples/budgets.yaml", "--skip", "BG006,BG008,BG002,BG013", out, rls); code != ExitFailure ||
		!strings.Contains(stdout, filepath.Join(rls, "agents_ai-budgets-agent-gateway.yaml")+":") ||
		!strings.Contains(stdout, `descriptors[0].descriptors[0]: budget "per-run" is in shadow mode in the spec`) {
		t.Fatalf("assert with the shadow spec over per-run's enforcing config: %d\n%s%s", code, stdout, stderr)
	}
}

// changedLines counts the lines that differ between two texts of the same
// line count (promotions edit in place), or returns -1 when the counts differ.
func changedLines(a, b string) int {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	if len(la) != len(lb) {
		return -1
	}
	n := 0
	for i := range la {
		if la[i] != lb[i] {
			n++
		}
	}
	return n
}

// Re-running a promotion that already landed (a retried CI job, a second
// operator) is done, not refused: exit 0, the state on stdout, and the file
// untouched byte for byte, also when the evidence would refuse it now. The
// same holds for demote of a budget in shadow.
func TestPromoteAgainIsIdempotent(t *testing.T) {
	p := copyExample(t)
	if code, _, stderr := runCLI(t, "promote", "per-run", "--spec", p, "--now", "2026-10-24T08:00:00Z", "--force", "--reason", "r"); code != ExitOK {
		t.Fatalf("promote: %d %s", code, stderr)
	}
	promoted, _ := os.ReadFile(p)
	st, _ := os.Stat(p)
	for _, args := range [][]string{
		{"promote", "per-run", "--spec", p, "--now", "2026-10-25T08:00:00Z", "--evidence", "../../examples/report/report.json"},
		{"promote", "per-run", "--spec", p, "--now", "2026-10-25T08:00:00Z", "--force", "--reason", "again"},
	} {
		code, stdout, stderr := runCLI(t, args...)
		if code != ExitOK || !strings.Contains(stdout, "per-run is already in enforce (since 2026-10-24); nothing to do") {
			t.Fatalf("%v: code %d stdout %q stderr %q", args, code, stdout, stderr)
		}
		if now, _ := os.ReadFile(p); !bytes.Equal(now, promoted) {
			t.Fatalf("%v changed the file", args)
		}
	}
	if st2, _ := os.Stat(p); !os.SameFile(st, st2) {
		t.Error("the spec was rewritten (a new inode) although nothing changed")
	}
	before := copyExample(t)
	src, _ := os.ReadFile(before)
	code, stdout, stderr := runCLI(t, "demote", "per-run", "--spec", before, "--now", "2026-10-25T08:00:00Z")
	if code != ExitOK || !strings.Contains(stdout, "per-run is already in shadow (since 2026-10-16); nothing to do") {
		t.Fatalf("demote of a shadow budget: code %d stdout %q stderr %q", code, stdout, stderr)
	}
	if now, _ := os.ReadFile(before); !bytes.Equal(now, src) {
		t.Fatal("demote of a shadow budget changed the file")
	}
}

// An agentgateway budget's shadow flag is not in a rendered policy but in
// the rate limit config of its domain (render --ratelimit-config): the
// "render again" line of promote and demote says so for such a budget, and
// only the Envoy Gateway line for the others.
func TestPromoteSaysWhereTheModeRenders(t *testing.T) {
	p := copyExample(t)
	for _, tc := range []struct {
		args []string
		want string
		not  string
	}{
		{[]string{"promote", "per-run", "--force", "--reason", "r"}, "--ratelimit-config", "shadowMode: false"},
		{[]string{"demote", "per-run"}, "shadow_mode: true", "shadowMode: true"},
		{[]string{"promote", "per-human", "--force", "--reason", "r"}, "shadowMode: false", "--ratelimit-config"},
	} {
		code, stdout, stderr := runCLI(t, append(tc.args, "--spec", p, "--now", "2026-10-24T08:00:00Z")...)
		if code != ExitOK || !strings.Contains(stdout, tc.want) || strings.Contains(stdout, tc.not) {
			t.Errorf("%v: code %d, want %q and not %q in stdout:\n%s%s", tc.args, code, tc.want, tc.not, stdout, stderr)
		}
	}
}

// A forced promotion without evidence warns that it promoted on --force
// alone only once it has: a write that fails (a read-only spec) says why it
// failed and no more.
func TestForcedWarningOnlyAfterTheWrite(t *testing.T) {
	p := copyExample(t)
	if err := os.Chmod(p, 0o444); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCLI(t, "promote", "per-run", "--spec", p, "--now", "2026-10-24T08:00:00Z", "--force", "--reason", "r")
	if code != ExitFailure || !strings.Contains(stderr, "is read-only") || strings.Contains(stderr, "is promoted on --force alone") {
		t.Fatalf("code %d stderr %s", code, stderr)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCLI(t, "promote", "per-run", "--spec", p, "--now", "2026-10-24T08:00:00Z", "--force", "--reason", "r")
	if code != ExitOK || !strings.Contains(stderr, "per-run is promoted on --force alone") {
		t.Fatalf("code %d stderr %s", code, stderr)
	}
}

// --max-limited-share NaN (strconv parses it) passed the range check, and
// every share compared with it was "under": the evidence's over-cap gate
// opened. It is a usage error now, like any share outside (0, 1].
func TestMaxLimitedShareNaNIsRefused(t *testing.T) {
	p := copyExample(t)
	for _, v := range []string{"NaN", "nan", "-Inf", "+Inf", "0", "1.5"} {
		code, _, stderr := runCLI(t, "promote", "per-run", "--spec", p, "--evidence", "../../examples/report/report.json", "--now", "2026-10-24T08:00:00Z", "--max-limited-share", v)
		if code != ExitUsage || !strings.Contains(stderr, "--max-limited-share must be in (0, 1]") {
			t.Errorf("--max-limited-share %s: code %d stderr %s", v, code, stderr)
		}
	}
}
