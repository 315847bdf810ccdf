package agentgateway

import (
	"strings"
	"testing"
)

// A claim read fails when the claim (or every verified JWT) is missing;
// coalesce and default, as agentgateway's, turn that into a fallback value.
func TestEvalEntry(t *testing.T) {
	for _, tc := range []struct {
		expr   string
		claims map[string]any
		want   string
		fails  bool
	}{
		{`string(jwt["run_id"])`, map[string]any{"run_id": "r1"}, "r1", false},
		{`string(jwt["run_id"])`, map[string]any{}, "", true},
		{`string(jwt["run_id"])`, nil, "", true},
		{`jwt.sub`, map[string]any{"sub": 7}, "", true}, // not a string
		{`coalesce(string(jwt["run_id"]), "` + NoClaim + `")`, nil, NoClaim, false},
		{`coalesce(string(jwt["run_id"]), "` + NoClaim + `")`, map[string]any{}, NoClaim, false},
		{`coalesce(string(jwt["run_id"]), "` + NoClaim + `")`, map[string]any{"run_id": "r1"}, "r1", false},
		{`coalesce(jwt.a, jwt.b, "x")`, map[string]any{"b": "y"}, "y", false},
		{`default(jwt.sub, "anon")`, nil, "anon", false},
		{`"per-run"`, nil, "per-run", false},
		// agentgateway's default falls back only on a missing key or variable
		// and on null (crates/celx/src/general.rs, default): string() of a
		// list, a map or null is a function error (cannot convert, in
		// crates/cel-fork/cel/src/functions.rs, string), which default passes
		// on, so the descriptor is dropped.
		{`default(string(jwt["run_id"]), "anon")`, map[string]any{}, "anon", false},
		{`default(string(jwt["run_id"]), "anon")`, nil, "anon", false},
		{`default(jwt.run_id, "anon")`, map[string]any{"run_id": nil}, "anon", false},
		{`default(string(jwt["run_id"]), "anon")`, map[string]any{"run_id": []any{"r1"}}, "", true},
		{`default(string(jwt["run_id"]), "anon")`, map[string]any{"run_id": map[string]any{"a": "b"}}, "", true},
		{`default(string(jwt["run_id"]), "anon")`, map[string]any{"run_id": nil}, "", true},
		// coalesce takes the first argument without an error, whatever the
		// error: the rendered entry charges a claim of any type somewhere.
		{`coalesce(string(jwt["run_id"]), "` + NoClaim + `")`, map[string]any{"run_id": []any{"r1"}}, NoClaim, false},
		{`coalesce(string(jwt["run_id"]), "` + NoClaim + `")`, map[string]any{"run_id": map[string]any{"a": "b"}}, NoClaim, false},
		{`coalesce(string(jwt["run_id"]), "` + NoClaim + `")`, map[string]any{"run_id": nil}, NoClaim, false},
		{`coalesce(string(jwt["run_id"]), "` + NoClaim + `")`, map[string]any{"run_id": true}, "true", false},
		{`coalesce(string(jwt["run_id"]), "` + NoClaim + `")`, map[string]any{"run_id": 7}, "7", false},
	} {
		got, err := EvalEntry(tc.expr, tc.claims)
		if (err != nil) != tc.fails || got != tc.want {
			t.Errorf("EvalEntry(%s, %v) = %q, %v; want %q, fails %v", tc.expr, tc.claims, got, err, tc.want, tc.fails)
		}
	}
}

func TestClaimsAndFunctions(t *testing.T) {
	claims, err := Claims(`coalesce(string(jwt["run_id"]), jwt.sub, jwt["team"], request.headers["x"])`)
	if err != nil || strings.Join(claims, ",") != "run_id,sub,team" {
		t.Errorf("Claims = %v, %v", claims, err)
	}
	fns, err := Functions(`variables().request.headers["x"] + uuid()`)
	if err != nil || strings.Join(fns, ",") != "_+_,_[_],uuid,variables" {
		t.Errorf("Functions = %v, %v", fns, err)
	}
}
