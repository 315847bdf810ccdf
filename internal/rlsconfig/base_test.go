package rlsconfig

import (
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
)

// TestBasePolicyMerged runs a policy merged from a base policy
// (spec.gateways[].basePolicy, rendered by pkg/render) through EG's
// translation: the base's rules keep their indices, the budgets are rule/2
// and up (as the rule-budgets annotation says), and the config of the shared
// domain holds the base's shared rule next to the budgets.
func TestBasePolicyMerged(t *testing.T) {
	p := loadPolicies(t, "testdata/base_merged.yaml")[0]
	cfgs, err := Configs([]*egv1a1.BackendTrafficPolicy{p})
	if err != nil {
		t.Fatal(err)
	}
	var shared []string
	for _, c := range cfgs {
		if c.Domain == "ai-gateway/agent-router-traffic" {
			for _, d := range c.Descriptors {
				shared = append(shared, d.Key)
			}
		}
	}
	want := []string{"ai-gateway/agent-router-traffic/rule/0", "ai-gateway/agent-router-traffic/rule/1", "ai-gateway/agent-router-traffic/rule/2", "ai-gateway/agent-router-traffic/rule/3", "ai-gateway/agent-router-traffic/rule/4", "ai-gateway/agent-router-traffic/rule/5"}
	if len(shared) != len(want) {
		t.Fatalf("shared domain descriptors %v, want %v (domains %v)", shared, want, domains(cfgs))
	}
	for i := range want {
		if shared[i] != want[i] {
			t.Errorf("descriptor %d = %s, want %s", i, shared[i], want[i])
		}
	}
	rls, err := RouteRateLimits(p)
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Headers: map[string]string{"x-ar-run": "r1", "x-ai-eg-model": "embed-small"},
		Metadata: map[string]string{"io.envoy.ai_gateway:llm_total_token": "700"}}
	calls, err := Requests(rls, req, PhaseRequest)
	if err != nil {
		t.Fatal(err)
	}
	got := descs(calls)["ai-gateway/agent-router-traffic"]
	wantReq := [][]entry{
		{{"ai-gateway/agent-router-traffic/rule/1", "ai-gateway/agent-router-traffic/rule/1"}, {"rule-1-match-0", "rule-1-match-0"}},
		{{"ai-gateway/agent-router-traffic/rule/2", "ai-gateway/agent-router-traffic/rule/2"}, {"rule-2-match-0", "r1"}, {"rule-2-match-1", "rule-2-match-1"}},
	}
	if !equalEntries(got, wantReq) {
		t.Errorf("request descriptors = %v, want %v", got, wantReq)
	}
	done, err := Requests(rls, req, PhaseStreamDone)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range done {
		for _, d := range c.Descriptors {
			if d.HitsAddend.GetValue() != 700 {
				t.Errorf("stream-done descriptor %v hits_addend %v, want 700 (only budget rules charge after the response)", d.Entries, d.HitsAddend)
			}
		}
	}
	if n := len(descs(done)["ai-gateway/agent-router-traffic"]); n != 1 {
		t.Errorf("stream-done descriptors %d, want 1 (rule/2)", n)
	}
}
