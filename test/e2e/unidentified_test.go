package e2e

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/internal/rlsconfig"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// rulesCharged lists the Envoy Gateway rules (indices, sorted) whose
// descriptors Envoy sends for a request with headers, at the request-time
// check and at the stream-done charge, from the rate_limits Envoy Gateway's
// translator gives the example's routes (rlsconfig.RouteRateLimits).
func (w *world) rulesCharged(headers map[string]string) []int {
	w.t.Helper()
	var out []int
	for _, phase := range []rlsconfig.Phase{rlsconfig.PhaseRequest, rlsconfig.PhaseStreamDone} {
		calls, err := rlsconfig.Requests(w.routes, rlsconfig.Request{Headers: headers, Metadata: map[string]string{tokenMeta: "1"}}, phase)
		if err != nil {
			w.t.Fatal(err)
		}
		for _, c := range calls {
			for _, d := range c.Descriptors {
				v := d.Entries[0].Value
				i, err := strconv.Atoi(v[strings.LastIndex(v, "/")+1:])
				if err != nil {
					w.t.Fatalf("descriptor %v names no rule", d.Entries)
				}
				if !slices.Contains(out, i) {
					out = append(out, i)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestUnidentifiedRequestsWhoIsCharged: on the example's Envoy Gateway, a
// request with neither x-ar-human nor x-api-key-client is charged to each
// per-principal budget's unidentified requests' rule; one with either header
// to no unidentified rule (an API key never to per-human's); an override
// principal to its override alone; an empty header value counts as present
// (Envoy's string match: ".*" matches it), so it is the principal "".
func TestUnidentifiedRequestsWhoIsCharged(t *testing.T) {
	w := newWorld(t, startValkey(t), morning, mode(spec.ModeEnforce, false))
	for _, tc := range []struct {
		who     string
		headers map[string]string
		want    []int
	}{
		{"neither identity header", unidentified(cheapModel), []int{rulePerHumanNoClaim, rulePerAPIKeyNoClaim}},
		{"neither, frontier model", unidentified("gpt-5"), []int{rulePerHumanNoClaim, rulePerAPIKeyNoClaim, ruleFrontier}},
		{"API key only", apiKey("k1"), []int{rulePerAPIKey}},
		{"human only", human("alice@example.com"), []int{rulePerHuman}},
		{"both", map[string]string{"x-ar-human": "alice@example.com", "x-api-key-client": "k1"}, []int{rulePerHuman, rulePerAPIKey}},
		{"override acme-batch", apiKey("acme-batch"), []int{ruleAcmeBatch}},
		{"override trial-42", apiKey("trial-42"), []int{ruleTrial42}},
		{"empty x-ar-human", map[string]string{"x-ar-human": ""}, []int{rulePerHuman}},
	} {
		if got := w.rulesCharged(tc.headers); !slices.Equal(got, tc.want) {
			t.Errorf("%s: rules %v, want %v", tc.who, got, tc.want)
		}
	}
}

// TestUnidentifiedRequestsShareOneCappedBucket: in enforce mode the calls
// with no identity header share per-api-key's unidentified bucket (1M, like
// one API key) and per-human's (2M, like one human): once spent, the next
// such call is denied, while API keys, overrides and humans, which are
// charged to none of them, keep going.
func TestUnidentifiedRequestsShareOneCappedBucket(t *testing.T) {
	w := newWorld(t, startValkey(t), morning, mode(spec.ModeEnforce, false))
	// The check comes before the charge: the first call passes at 0 and
	// spends 2.5M, past both unidentified caps.
	if got := w.calls(2, unidentified(cheapModel), 2_500_000); got != "+-" {
		t.Errorf("unidentified: %s, want +- (the first call spends both caps)", got)
	}
	for _, tc := range []struct {
		who     string
		headers map[string]string
	}{
		{"API key k1", apiKey("k1")},
		{"override acme-batch", apiKey("acme-batch")},
		{"human alice", human("alice@example.com")},
	} {
		if got := w.calls(2, tc.headers, 100_000); got != "++" {
			t.Errorf("%s after the unidentified buckets are spent: %s, want ++", tc.who, got)
		}
	}
	if got := w.calls(1, unidentified("gpt-5-mini"), 1); got != "-" {
		t.Errorf("unidentified again: %s, want denied for the rest of the day", got)
	}
}

// TestUnidentifiedRequestsInShadowMode: with the budgets in shadow, the same
// calls all pass, and the service counts their would-be denials on the
// unidentified rules, as the counter model predicts.
func TestUnidentifiedRequestsInShadowMode(t *testing.T) {
	w := newWorld(t, startValkey(t), morning, mode(spec.ModeShadow, false))
	if got := w.calls(3, unidentified(cheapModel), 1_500_000); got != "+++" {
		t.Errorf("unidentified in shadow mode: %s, want all admitted", got)
	}
	got := w.shadowOverLimit()
	for _, r := range []int{rulePerHumanNoClaim, rulePerAPIKeyNoClaim} {
		if got[egRule(r)] == 0 || got[egRule(r)] != w.oracle.shadowOver[egRule(r)] {
			t.Errorf("rule %d: %d would-be denials, the counter model says %d (want some)", r, got[egRule(r)], w.oracle.shadowOver[egRule(r)])
		}
	}
	for r, n := range got {
		if n > 0 && r != egRule(rulePerHumanNoClaim) && r != egRule(rulePerAPIKeyNoClaim) {
			t.Errorf("rule %s: %d would-be denials from calls it does not count", r, n)
		}
	}
}
