package agentgateway

import "testing"

func budgetLimit() *GlobalRateLimit {
	return &GlobalRateLimit{Domain: "ns/p", Descriptors: []Descriptor{
		{Unit: UnitTokens, Entries: []Entry{{Name: "budget", Expression: `"per-run"`}, {Name: "principal", Expression: `string(jwt["run_id"])`}}},
		{Unit: UnitRequests, Entries: []Entry{{Name: "x", Expression: `"y"`}}},
	}}
}

// The request shape of remoteratelimit.rs: check with the estimate (0 when
// not tokenized), amend with (response input - estimate) + output.
func TestRequestsShape(t *testing.T) {
	check, amend, err := Requests(budgetLimit(), LLMRequest{Claims: map[string]any{"run_id": "r1"}, InputTokens: 300, OutputTokens: 200})
	if err != nil {
		t.Fatal(err)
	}
	if check.Domain != "ns/p" || check.HitsAddend != 0 || len(check.Descriptors) != 1 {
		t.Fatalf("check = %v", check)
	}
	d := check.Descriptors[0]
	if d.HitsAddend.GetValue() != 0 || d.HitsAddend == nil || d.Entries[0].Value != "per-run" || d.Entries[1].Key != "principal" || d.Entries[1].Value != "r1" {
		t.Errorf("check descriptor = %v", d)
	}
	if amend.Descriptors[0].HitsAddend.GetValue() != 500 {
		t.Errorf("amend = %v, want 500 tokens", amend)
	}
	check, amend, _ = Requests(budgetLimit(), LLMRequest{Claims: map[string]any{"run_id": "r1"}, EstimatedInputTokens: 320, InputTokens: 300, OutputTokens: 200})
	if check.Descriptors[0].HitsAddend.GetValue() != 320 || amend.Descriptors[0].HitsAddend.GetValue() != 180 {
		t.Errorf("tokenized: check %v amend %v, want 320 then 180", check, amend)
	}
	_, amend, _ = Requests(budgetLimit(), LLMRequest{Claims: map[string]any{"run_id": "r1"}, EstimatedInputTokens: 900, InputTokens: 300, OutputTokens: 200})
	if amend == nil || len(amend.Descriptors) != 0 {
		t.Errorf("negative amend: %v, want the call sent without the descriptor", amend)
	}
	// No verified JWT, or a claim that is missing: no call at all.
	for _, claims := range []map[string]any{nil, {"sub": "x"}} {
		if check, _, err := Requests(budgetLimit(), LLMRequest{Claims: claims, InputTokens: 1}); check != nil || err != nil {
			t.Errorf("claims %v: check %v err %v, want no call", claims, check, err)
		}
	}
}

func TestVariables(t *testing.T) {
	for expr, want := range map[string]string{
		`string(jwt["sub"])`:                 "jwt",
		`request.headers["x-user"]`:          "request",
		`has(jwt.sub) ? jwt.sub : apiKey.id`: "apiKey,jwt",
		`"literal"`:                          "",
	} {
		vars, err := Variables(expr)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for i, v := range vars {
			if i > 0 {
				got += ","
			}
			got += v
		}
		if got != want {
			t.Errorf("Variables(%s) = %s, want %s", expr, got, want)
		}
	}
	if _, err := Variables(`jwt[`); err == nil {
		t.Error("a broken expression parsed")
	}
}

// The descriptors budgetgen renders cannot fail: a request without the claim
// (or without a verified JWT) is charged to the NoClaim bucket, not skipped.
func TestRequestsWithoutClaimUseNoClaimBucket(t *testing.T) {
	g := budgetLimit()
	g.Descriptors[0].Entries[1].Expression = `coalesce(string(jwt["run_id"]), "` + NoClaim + `")`
	for _, claims := range []map[string]any{nil, {"sub": "x"}} {
		check, _, err := Requests(g, LLMRequest{Claims: claims, InputTokens: 1})
		if err != nil || check == nil || check.Descriptors[0].Entries[1].Value != NoClaim {
			t.Errorf("claims %v: check %v err %v, want principal %s", claims, check, err, NoClaim)
		}
	}
}

// TestRequestsWithCost: with a cost expression the request-time call is a
// check (hits_addend 0) even for a tokenized prompt and the amend carries
// the cost; a response without usage (an upstream error) leaves
// llm.totalTokens unset, so the descriptor is left out of the amend, where
// without a cost agentgateway amends it with 0 (which the service cannot
// tell from a new check).
func TestRequestsWithCost(t *testing.T) {
	withCost := budgetLimit()
	withCost.Descriptors[0].Cost = CostTotalTokens
	run := map[string]any{"run_id": "r1"}
	check, amend, err := Requests(withCost, LLMRequest{Claims: run, EstimatedInputTokens: 320, InputTokens: 300, OutputTokens: 200})
	if err != nil {
		t.Fatal(err)
	}
	if got := check.Descriptors[0].HitsAddend; got == nil || got.GetValue() != 0 {
		t.Errorf("tokenized with a cost: check hits %v, want 0", got)
	}
	if got := amend.Descriptors[0].HitsAddend.GetValue(); got != 500 {
		t.Errorf("amend %d, want the 500 tokens of the response", got)
	}
	if _, amend, _ = Requests(withCost, LLMRequest{Claims: run, NoUsage: true}); amend == nil || len(amend.Descriptors) != 0 || amend.Domain != withCost.Domain {
		t.Errorf("a response without usage amended with a cost: %v, want the call sent without the descriptor", amend)
	}
	_, amend, _ = Requests(budgetLimit(), LLMRequest{Claims: run, NoUsage: true})
	if amend == nil || amend.Descriptors[0].HitsAddend.GetValue() != 0 {
		t.Errorf("without a cost, a response without usage: amend %v, want hits_addend 0", amend)
	}
	part := budgetLimit()
	part.Descriptors[0].Cost = "llm.outputTokens"
	if _, amend, _ = Requests(part, LLMRequest{Claims: run, InputTokens: 300, OutputTokens: 200}); amend.Descriptors[0].HitsAddend.GetValue() != 200 {
		t.Errorf("cost llm.outputTokens: amend %v, want 200", amend)
	}
}

// TestZeroUsageChargesOneToken: a response that reports a usage of 0
// tokens is amended with 1 under the rendered cost, not with 0, which the
// service would read as a new check (a second hold on a reserving budget);
// without the rendered cost agentgateway sends 0.
func TestZeroUsageChargesOneToken(t *testing.T) {
	withCost := budgetLimit()
	withCost.Descriptors[0].Cost = CostTotalTokens
	run := map[string]any{"run_id": "r1"}
	_, amend, err := Requests(withCost, LLMRequest{Claims: run})
	if err != nil {
		t.Fatal(err)
	}
	if len(amend.Descriptors) != 1 || amend.Descriptors[0].HitsAddend.GetValue() != 1 {
		t.Errorf("zero usage with the rendered cost: amend %v, want hits_addend 1", amend)
	}
	if _, amend, _ = Requests(budgetLimit(), LLMRequest{Claims: run}); amend.Descriptors[0].HitsAddend.GetValue() != 0 {
		t.Errorf("zero usage without a cost: amend %v, want hits_addend 0", amend)
	}
	for _, n := range []uint64{1, 7, 1 << 40} {
		_, amend, _ = Requests(withCost, LLMRequest{Claims: run, InputTokens: n - 1, OutputTokens: 1})
		if got := amend.Descriptors[0].HitsAddend.GetValue(); got != n {
			t.Errorf("usage %d: amend %d", n, got)
		}
	}
}
