package spec

import (
	"strings"
	"testing"
)

// TestReserveLoads: reserve is an integer or auto (with reserveInitial), on
// budgets and the frontier cap; missing means no reservation.
func TestReserveLoads(t *testing.T) {
	doc := base + "      reserve: 50_000\n    - name: fleet\n      perPrincipal: x-api-key-client\n      tokensPerDay: 10\n      reserve: auto\n      reserveInitial: 8000\n" +
		"  frontier: {models: [gpt-5], tokensPerDay: 100, reserve: 7}\n"
	bs, err := Load([]byte(doc), "b.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b0, b1, f := bs.Spec.Budgets[0].Reservation, bs.Spec.Budgets[1].Reservation, bs.Spec.Frontier.Reservation
	if !b0.On() || b0.Reserve.Auto() || b0.Reserve.Tokens() != 50_000 {
		t.Errorf("budget 0: %+v, want a fixed 50,000", b0)
	}
	if !b1.On() || !b1.Reserve.Auto() || b1.ReserveInitial != 8000 || b1.Reserve.Tokens() != 0 {
		t.Errorf("budget 1: %+v, want auto from 8,000", b1)
	}
	if f.Reserve.Tokens() != 7 {
		t.Errorf("frontier: %+v", f)
	}
	plain, err := Load([]byte(base), "b.yaml")
	if err != nil || plain.Spec.Budgets[0].On() {
		t.Fatalf("no reserve: %+v, %v; want none", plain.Spec.Budgets[0].Reservation, err)
	}
}

// TestReserveErrors: each bad reservation is named by file, line and field.
func TestReserveErrors(t *testing.T) {
	for _, tc := range []struct{ name, extra, want string }{
		{"word", "      reserve: lots\n", `b.yaml:13: spec.budgets[0].reserve: must be auto or a number of tokens from 1 to 4294967295000, got "lots"`},
		{"zero", "      reserve: 0\n", `b.yaml:13: spec.budgets[0].reserve: must be auto or a number of tokens from 1 to 4294967295000, got "0"`},
		{"negative", "      reserve: -5\n", `b.yaml:13: spec.budgets[0].reserve: must be auto or a number of tokens from 1 to 4294967295000, got "-5"`},
		{"auto without initial", "      reserve: auto\n", "b.yaml:13: spec.budgets[0].reserve: auto needs reserveInitial, the tokens held for each request until the budget has seen enough charges to learn from"},
		{"initial without auto", "      reserve: 10\n      reserveInitial: 5\n", "b.yaml:14: spec.budgets[0].reserveInitial: is only for reserve: auto (this reserve is fixed: 10)"},
		{"initial alone", "      reserveInitial: 5\n", "b.yaml:13: spec.budgets[0].reserveInitial: is only for reserve: auto"},
		// A misspelt auto is one error, not also "reserveInitial is only for
		// reserve: auto (this reserve is fixed: atuo)".
		{"auto misspelt", "      reserve: atuo\n      reserveInitial: 5\n", `b.yaml:13: spec.budgets[0].reserve: must be auto or a number of tokens from 1 to 4294967295000, got "atuo"`},
		{"list", "      reserve: [1]\n", `b.yaml:13: spec.budgets[0].reserve: must be a string, got a list`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]byte(base+tc.extra), "b.yaml")
			if err == nil || err.Error() != tc.want {
				t.Fatalf("error:\n got %v\nwant %s", err, tc.want)
			}
		})
	}
}

// TestReserveUnits: a rule that counts thousands of tokens or money holds
// the reserve in its own unit, never less than the tokens it stands for.
func TestReserveUnits(t *testing.T) {
	doc := strings.Replace(base, "  budgets:", "  pricing:\n    models: [{model: cheap, input: 1, output: 2}, {model: dear, input: 3, output: 15}]\n    default: {input: 10, output: 12}\n  budgets:", 1)
	bs, err := Load([]byte(doc), "b.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tokens     int64
		kilo, cost bool
		want       int64
	}{
		{50_000, false, false, 50_000},
		{50_001, true, false, 51},
		{1, true, false, 1},
		// 50,000 tokens at the dearest price (the default's cache writes:
		// twice its input, 20 per million) = 1.00 = 10,000 units of 1/10,000.
		{50_000, false, true, 10_000},
		{1, false, true, 1}, // 0.00002: rounded up to one unit
	} {
		got, err := bs.ReserveUnits(tc.tokens, tc.kilo, tc.cost)
		if err != nil || got != tc.want {
			t.Errorf("ReserveUnits(%d, kilo %v, cost %v) = %d, %v; want %d", tc.tokens, tc.kilo, tc.cost, got, err, tc.want)
		}
	}
}
