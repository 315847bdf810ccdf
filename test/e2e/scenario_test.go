package e2e

import (
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/valkeytest"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// Rule indices of the example spec's rendered Envoy Gateway policy (see its
// budgetgen.dev/rule-budgets annotation): B3-B5, each per-principal budget's
// rules followed by its rule for unidentified requests (principal
// budgetgen/no-claim). B1-B2 (per-run, agent-fleet) run on agentgateway.
const (
	rulePerHuman = iota
	rulePerHumanNoClaim
	rulePerAPIKey
	ruleAcmeBatch
	ruleTrial42
	rulePerAPIKeyNoClaim
	ruleFrontier
	ruleKillSwitch
)

func mode(m spec.Mode, killSwitch bool) func(*spec.BudgetSet) {
	return func(bs *spec.BudgetSet) {
		for i := range bs.Spec.Budgets {
			bs.Spec.Budgets[i].Mode = m
		}
		if f := bs.Spec.Frontier; f != nil {
			f.Mode = m
			f.KillSwitch = killSwitch
		}
	}
}

// agentRun and fleetOnly are the verified JWT's claims of an agent's call
// through agentgateway (the ServiceAccount token's run_id and kind).
func agentRun(run string) map[string]string {
	return map[string]string{"run_id": run, "kind": "agent"}
}
func fleetOnly() map[string]string {
	return map[string]string{"kind": "agent"}
}

// unidentified is a call through Envoy Gateway with neither identity header
// (a verified token without the email claim): no principal's budget keys on
// it, so each per-principal budget charges it to its one no-claim bucket.
func unidentified(model string) map[string]string {
	return map[string]string{"x-ai-eg-model": model}
}
func human(email string) map[string]string {
	return humanOn(email, cheapModel)
}
func humanOn(email, model string) map[string]string {
	return map[string]string{"x-ar-human": email, "x-ai-eg-model": model}
}
func apiKey(k string) map[string]string {
	return map[string]string{"x-api-key-client": k, "x-ai-eg-model": cheapModel}
}

// step is a principal's share of the day: n calls of tokens each through
// one gateway (via), and the admitted (+) / denied (-) pattern expected in
// enforce mode.
type step struct {
	who     string
	via     string
	attrs   map[string]string // headers (Envoy Gateway) or JWT claims (agentgateway)
	n       int
	tokens  uint64
	enforce string
}

// day is a day of traffic over every budget kind of the example spec.
var day = []step{
	// per-run (5M, agentgateway): the 6th 1M call is still checked at 5M (not over), the 7th is denied.
	{"run r1", viaAgentgateway, agentRun("r1"), 7, 1_000_000, "++++++-"},
	{"run r2", viaAgentgateway, agentRun("r2"), 2, 100_000, "++"},
	// per-human (2M, Envoy Gateway).
	{"human alice", viaEnvoy, human("alice@example.com"), 3, 1_500_000, "++-"},
	{"human bob", viaEnvoy, human("bob@example.com"), 2, 100_000, "++"},
	// per-API-key (1M) and its overrides: acme-batch 20M (seven 3M calls
	// pass where the default cap would stop the second), trial-42 100k.
	{"key k1", viaEnvoy, apiKey("k1"), 3, 600_000, "++-"},
	{"key k2", viaEnvoy, apiKey("k2"), 1, 100_000, "+"},
	{"key acme-batch", viaEnvoy, apiKey("acme-batch"), 8, 3_000_000, "+++++++-"},
	{"key trial-42", viaEnvoy, apiKey("trial-42"), 3, 60_000, "++-"},
	// Calls with neither identity header share one bucket per budget, capped
	// like one principal: per-api-key's (1M) binds first, at the third call.
	{"no identity header", viaEnvoy, unidentified(cheapModel), 3, 600_000, "++-"},
	// frontier (50M shared, Envoy Gateway): every call above used a cheap
	// model, so the bucket starts empty; three humans' 30M calls, the third
	// is denied (the frontier, not their own empty budgets).
	{"frontier fay", viaEnvoy, humanOn("fay@example.com", "claude-opus-4"), 1, 30_000_000, "+"},
	{"frontier gus", viaEnvoy, humanOn("gus@example.com", "claude-opus-4"), 1, 30_000_000, "+"},
	{"frontier hal", viaEnvoy, humanOn("hal@example.com", "claude-opus-4"), 1, 30_000_000, "-"},
	// Two budgets on one call: dave is far under his own cap, the frontier binds.
	{"human dave on frontier", viaEnvoy, map[string]string{"x-ar-human": "dave@example.com", "x-ai-eg-model": "gpt-5"}, 1, 1_000, "-"},
	// A fleet token without a run_id: its per-run descriptor is charged to
	// the one shared no-claim bucket (render's coalesce), capped at 5M like a
	// run, instead of being dropped (which made no per-run call at all).
	{"fleet token without run_id", viaAgentgateway, fleetOnly(), 3, 3_000_000, "++-"},
	// agent fleet (200M shared, agentgateway), at 12.2M now: two runs' 120M
	// calls pass, a third run's is denied, and a new run of the fleet is
	// denied too (its per-run bucket is empty: the fleet binds).
	{"fleet run f1", viaAgentgateway, agentRun("f1"), 1, 120_000_000, "+"},
	{"fleet run f2", viaAgentgateway, agentRun("f2"), 1, 120_000_000, "+"},
	{"fleet run f3", viaAgentgateway, agentRun("f3"), 1, 120_000_000, "-"},
	{"run r3", viaAgentgateway, agentRun("r3"), 1, 1_000, "-"},
	{"human dave", viaEnvoy, human("dave@example.com"), 1, 1_000, "+"},
}

// testDay is tomorrow's 00:00 UTC. The service runs on an injected clock,
// but Valkey expires counters on its own: the end of the injected day (plus
// the grace) must lie ahead, or every counter is deleted as soon as its
// expiry is set. A fixed date broke these tests the day after it.
func testDay() time.Time {
	return time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
}

var morning = testDay().Add(8 * time.Hour)

func startValkey(t *testing.T) *valkeytest.Server {
	return valkeytest.Start(t, valkeytest.Options{})
}

func TestEnforceAdmitsAndDeniesEachBudgetKind(t *testing.T) {
	vk := startValkey(t)
	w := newWorld(t, vk, morning, mode(spec.ModeEnforce, false))
	for _, s := range day {
		if got := w.callsVia(s.via, s.n, s.attrs, s.tokens); got != s.enforce {
			t.Errorf("%s: %s, want %s", s.who, got, s.enforce)
		}
	}
	if n, err := vk.Do("DBSIZE"); err != nil || n == "0" {
		t.Errorf("Valkey holds %q keys (%v): the counters are not in Valkey", n, err)
	}
	for r, n := range w.shadowOverLimit() {
		if n != 0 {
			t.Errorf("rule %s: %d shadow over-limit decisions in enforce mode", r, n)
		}
	}
}

func TestShadowAdmitsAllAndRecordsWouldBeDenials(t *testing.T) {
	vk := startValkey(t)
	w := newWorld(t, vk, morning, mode(spec.ModeShadow, false))
	for _, s := range day {
		want := ""
		for range s.n {
			want += "+"
		}
		if got := w.callsVia(s.via, s.n, s.attrs, s.tokens); got != want {
			t.Errorf("%s: %s, want all admitted in shadow mode", s.who, got)
		}
	}
	got := w.shadowOverLimit()
	rules := []string{agwBudget("per-run"), agwBudget("agent-fleet")}
	for _, i := range []int{rulePerHuman, rulePerAPIKey, ruleAcmeBatch, ruleTrial42, rulePerAPIKeyNoClaim, ruleFrontier} {
		rules = append(rules, egRule(i))
	}
	for _, r := range rules {
		if got[r] == 0 {
			t.Errorf("rule %s: no would-be denial recorded", r)
		}
		if got[r] != w.oracle.shadowOver[r] {
			t.Errorf("rule %s: %d would-be denials recorded, the counter model says %d", r, got[r], w.oracle.shadowOver[r])
		}
	}
	// Every rule that decided has a series (at 0 when never over): per-human's
	// no-claim bucket saw 1.8M of its 2M.
	over := 0
	for _, n := range got {
		if n > 0 {
			over++
		}
	}
	if over != len(rules) || got[egRule(rulePerHumanNoClaim)] != 0 {
		t.Errorf("would-be denials on rules %v, want exactly %v", got, rules)
	}
}

// The kill switch is a request-count rule with limit 0, rendered enforced
// whatever the budgets' mode: frontier requests are denied from the first one
// and charge nothing, other models pass.
func TestKillSwitchDeniesFrontierAtOnce(t *testing.T) {
	vk := startValkey(t)
	w := newWorld(t, vk, morning, mode(spec.ModeShadow, true))
	if len(w.btp.Spec.RateLimit.Global.Rules) != ruleKillSwitch+1 {
		t.Fatalf("kill switch rule not rendered: %d rules", len(w.btp.Spec.RateLimit.Global.Rules))
	}
	for _, m := range []string{"gpt-5", "gpt-5-mini", "claude-opus-4-1"} {
		if got := w.calls(2, map[string]string{"x-ar-human": "erin@example.com", "x-ai-eg-model": m}, 10); got != "--" {
			t.Errorf("%s: %s, want denied from the first request", m, got)
		}
	}
	if got := w.calls(2, human("erin@example.com"), 10); got != "++" {
		t.Errorf("non-frontier model: %s, want admitted", got)
	}
	// Nothing was charged for the denied calls: erin's budget holds 2 x 10 tokens.
	if got := w.calls(1, human("erin@example.com"), 1_999_980); got != "+" {
		t.Errorf("erin at 20 tokens: %s", got)
	}
}

// Budgets are daily windows starting at 00:00 UTC: a principal exhausted at
// 23:59:59.9 is admitted again at 00:00:00.0.
func TestBudgetsResetAtMidnightUTC(t *testing.T) {
	vk := startValkey(t)
	evening := testDay().Add(23*time.Hour + 50*time.Minute)
	w := newWorld(t, vk, evening, mode(spec.ModeEnforce, false))
	alice := human("alice@example.com")
	if got := w.calls(2, alice, 1_500_000); got != "++" {
		t.Fatalf("alice before midnight: %s", got)
	}
	w.clock.Set(testDay().Add(24*time.Hour - 100*time.Millisecond)) // 23:59:59.9
	if w.llmCall(alice, 1) {
		t.Error("alice admitted at 23:59:59.9 over her daily budget")
	}
	w.clock.Set(testDay().Add(24 * time.Hour)) // 00:00:00.0 the next day
	if !w.llmCall(alice, 1_500_000) {
		t.Error("alice denied at 00:00:00.0: the budget did not reset")
	}
	// The new day is a full budget again, and it runs out the same way.
	if got := w.calls(2, alice, 1_500_000); got != "+-" {
		t.Errorf("alice's next calls of the new day: %s, want +-", got)
	}
}
