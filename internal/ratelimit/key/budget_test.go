package key

import "testing"

// The same budget and principal from Envoy Gateway's and agentgateway's
// request shapes is one key; anything else differs.
func TestAppendBudgetSameCounterAcrossRequestShapes(t *testing.T) {
	e := Encoder{Prefix: "p:"}
	eg := entries("a/p-gw1/rule/0", "a/p-gw1/rule/0", "rule-0-match-0", "run-1")
	eg2 := entries("b/p-gw2/rule/3", "b/p-gw2/rule/3", "rule-3-match-0", "run-1", "rule-3-match-1", "rule-3-match-1")
	agw := entries("budget", "per-run", "principal", "run-1")
	k1 := string(e.AppendBudget(nil, "s/per-run", "", false, eg, 0b10, 86400, 86400*3))
	k2 := string(e.AppendBudget(nil, "s/per-run", "", false, eg2, 0b10, 86400, 86400*3))
	k3 := string(e.AppendBudget(nil, "s/per-run", "", false, agw, 0b10, 86400, 86400*3))
	if k1 != k2 || k1 != k3 {
		t.Fatalf("keys differ: %q %q %q", k1, k2, k3)
	}
	if want := "p:bgb1|9:s/per-run1:5:run-1@86400|259200"; k1 != want {
		t.Errorf("key = %q, want %q", k1, want)
	}
	// An override's fixed principal equals the same principal sent as a value.
	fixed := string(e.AppendBudget(nil, "s/per-run", "run-1", true, entries("x", "x", "m", "m"), 0, 86400, 86400*3))
	if fixed != k1 {
		t.Errorf("fixed principal key %q != %q", fixed, k1)
	}
	distinct := map[string]string{
		"other principal": string(e.AppendBudget(nil, "s/per-run", "", false, entries("budget", "per-run", "principal", "run-2"), 0b10, 86400, 86400*3)),
		"other bucket":    string(e.AppendBudget(nil, "s/per-run@a/gw1", "", false, eg, 0b10, 86400, 86400*3)),
		"other window":    string(e.AppendBudget(nil, "s/per-run", "", false, eg, 0b10, 86400, 86400*4)),
		"group (none)":    string(e.AppendBudget(nil, "s/per-run", "", false, eg, 0, 86400, 86400*3)),
		"per-rule key":    string(e.Append(nil, "a/p-gw1", eg, nil, 86400, 86400*3)),
	}
	seen := map[string]string{k1: "base"}
	for name, k := range distinct {
		if prev, dup := seen[k]; dup {
			t.Errorf("%s shares key %q with %s", name, k, prev)
		}
		seen[k] = name
	}
}

// Bucket and principal boundaries cannot be shifted: netstrings.
func TestAppendBudgetNoBoundaryCollision(t *testing.T) {
	var e Encoder
	a := e.AppendBudget(nil, "s/a", "b", true, nil, 0, 1, 0)
	b := e.AppendBudget(nil, "s/", "ab", true, nil, 0, 1, 0)
	c := e.AppendBudget(nil, "s/a", "", false, entries("k", "b", "l", "c"), 0b11, 1, 0)
	d := e.AppendBudget(nil, "s/a", "", false, entries("k", "b:c"), 0b1, 1, 0)
	if string(a) == string(b) || string(c) == string(d) {
		t.Errorf("collision: %q %q %q %q", a, b, c, d)
	}
}
