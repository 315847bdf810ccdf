package report

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

const reserveSpec = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: r}
spec:
  gateways: [{namespace: gw, name: router}]
  identities:
    x-run: {jwtClaim: run_id}
    x-team: {extAuth: true}
  budgets:
    - {name: per-run, perPrincipal: x-run, tokensPerDay: 1000000, reserve: 50000}
    - {name: per-team, perPrincipal: x-team, tokensPerDay: 1000000, reserve: auto, reserveInitial: 20000}
    - {name: plain, perPrincipal: x-team, tokensPerDay: 5000000}
  frontier: {models: ["gpt-5.*"], tokensPerDay: 9000000, reserve: 100000}
`

// TestReserveFromSpec: the report names each budget's reserve as the spec
// gives it, and nothing for a budget without one.
func TestReserveFromSpec(t *testing.T) {
	bs, err := spec.Load([]byte(reserveSpec), "r.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := MappingFromSpec(bs)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"per-run": "50000", "per-team": "auto", "plain": "", "frontier": "100000"} {
		if got := m.Budgets[name].Reserve; got != want {
			t.Errorf("%s: reserve %q, want %q", name, got, want)
		}
	}
}

// TestReservationsPerCap: a rule's reservations go to the population it
// counts (the default rule's, or an override's own), in the cap's measure
// (a kilotoken rule's units times 1,000, a money rule's in the currency),
// per window and per day of an hour cap; windows outside the judged ones
// are left out. A budget that reserves shows its reservations even at zero
// (a service that does not reserve shows), one that does not and has none
// shows nothing.
func TestReservationsPerCap(t *testing.T) {
	r := reservationReport(t)
	big := find(t, r, "big")
	tok, cost := capOf(t, big, "day", MeasureTokens), capOf(t, big, "day", MeasureCost)
	if s := tok.Summary; s.Holds != 4 || s.Held != 200_000 || s.Expired != 50_000 {
		t.Errorf("kilotoken rule's holds in tokens: %+v", s)
	}
	if len(tok.Overridden) != 1 || tok.Overridden[0].Summary.Holds != 2 || tok.Overridden[0].Summary.Held != 100_000 {
		t.Errorf("the override's own rule's holds: %+v", tok.Overridden)
	}
	if s := cost.Summary; s.Holds != 4 || s.Held != 30_000 {
		t.Errorf("money rule's holds: %+v", s)
	}
	hc := capOf(t, find(t, r, "hourly"), "hour", MeasureTokens)
	if s := hc.Summary; s.Holds != 4 || s.Held != 20_000 || s.Expired != 5_000 || s.ReserveDenied != 1 {
		t.Errorf("hour cap: %+v", s)
	}
	if d := hc.PerDay[6]; d.Holds != 4 || d.Held != 20_000 || d.Expired != 5_000 || d.ReserveDenied != 1 {
		t.Errorf("hour cap's day: %+v", d)
	}
	checkReservationFormats(t, r)
	// A 429 the reservations alone caused is shown beside the verdict,
	// without holding the promotion back; a cap without one has no note.
	if n := hc.Verdict.Notes; len(n) != 1 || !strings.HasPrefix(n[0], "reservations alone caused 1 of its 429s") {
		t.Errorf("hour cap's verdict notes: %q", n)
	}
	if n := tok.Verdict.Notes; len(n) != 0 {
		t.Errorf("a cap without reservation-only denials has notes: %q", n)
	}
}

// reservationReport builds a report of reserving budgets of every kind of
// rule (kilotokens, money, an override's own, hours), one reserving budget
// without holds and one budget without reserve.
func reservationReport(t *testing.T) *Report {
	t.Helper()
	rule := func(r string) ledger.RuleID { return ledger.RuleID{Domain: ledger.BudgetDomain, Rule: r} }
	m := Mapping{
		Rules: map[ledger.RuleID]RuleInfo{
			rule("s/big#ktokens"): {Budget: "big", Kind: budgetmap.KindTokens, Measure: MeasureTokens, Scale: 1000},
			rule("s/big#cost"):    {Budget: "big", Kind: budgetmap.KindTokens, Measure: MeasureCost, Scale: 1},
			rule("s/big/vip"):     {Budget: "big", Kind: budgetmap.KindTokens, Principal: "vip", Measure: MeasureTokens, Scale: 1000},
			rule("s/hourly"):      {Budget: "hourly", Kind: budgetmap.KindTokens, Measure: MeasureTokens, Scale: 1},
			rule("s/idle"):        {Budget: "idle", Kind: budgetmap.KindTokens, Measure: MeasureTokens, Scale: 1},
			rule("s/plain"):       {Budget: "plain", Kind: budgetmap.KindTokens, Measure: MeasureTokens, Scale: 1},
		},
		Budgets: map[string]BudgetInfo{
			"big": {Mode: "shadow", Reserve: "auto", Caps: map[CapKey]CapInfo{
				{ledger.PeriodDay, MeasureTokens}: {Cap: 10_000_000_000}, {ledger.PeriodDay, MeasureCost}: {Cap: 5_000_000, Currency: "EUR"},
			}, Overrides: map[string]map[CapKey]CapInfo{"vip": {{ledger.PeriodDay, MeasureTokens}: {Cap: 20_000_000_000}}}},
			"hourly": {Mode: "shadow", Reserve: "5000", Caps: map[CapKey]CapInfo{{ledger.PeriodHour, MeasureTokens}: {Cap: 100_000}}},
			"idle":   {Mode: "shadow", Reserve: "5000", Caps: dayCap(100_000)},
			"plain":  {Mode: "shadow", Caps: dayCap(100_000)},
		},
	}
	day := ledger.DayOf(now) - 1
	dw := ledger.DayWindow(day)
	hour := func(h int) ledger.Window {
		return ledger.WindowAt(ledger.PeriodHour, day.Start().Add(time.Duration(h)*time.Hour), nil)
	}
	data := []ledger.Data{
		{Rule: rule("s/big#ktokens"), Window: dw, Usage: map[string]uint64{"a": 7_000}, Holds: ledger.Holds{Count: 4, Held: 200, Expired: 50}},
		{Rule: rule("s/big#ktokens"), Window: ledger.DayWindow(day - 30), Holds: ledger.Holds{Count: 99, Held: 99}}, // not judged
		{Rule: rule("s/big#cost"), Window: dw, Usage: map[string]uint64{"a": 10_000}, Holds: ledger.Holds{Count: 4, Held: 30_000}},
		{Rule: rule("s/big/vip"), Window: dw, Usage: map[string]uint64{"vip": 9_000}, Holds: ledger.Holds{Count: 2, Held: 100}},
		{Rule: rule("s/hourly"), Window: hour(9), Usage: map[string]uint64{"a": 10}, Holds: ledger.Holds{Count: 3, Held: 15_000}, Denials: ledger.Denials{Shadow: 1, Reserve: 1}},
		{Rule: rule("s/hourly"), Window: hour(17), Usage: map[string]uint64{"a": 10}, Holds: ledger.Holds{Count: 1, Held: 5_000, Expired: 5_000}},
		{Rule: rule("s/idle"), Window: dw, Usage: map[string]uint64{"a": 10}},
		{Rule: rule("s/plain"), Window: dw, Usage: map[string]uint64{"a": 10}},
	}
	r, err := Build(data, m, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkReservationFormats: every format says each cap's reservations.
func checkReservationFormats(t *testing.T, r *Report) {
	t.Helper()
	var text bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	out := text.String()
	for _, want := range []string{
		"reservations (reserve auto): 4 holds, 200,000 tokens held, 50,000 tokens expired without a charge",
		"reservations (reserve auto): 4 holds, EUR 3.0000 held, EUR 0.0000 expired without a charge",
		"      reservations (reserve auto): 2 holds, 100,000 tokens held, 0 tokens expired without a charge", // the override's line
		"reservations (reserve 5,000 tokens): 4 holds, 20,000 tokens held, 5,000 tokens expired without a charge",
		"reservations (reserve 5,000 tokens): 0 holds, 0 tokens held, 0 tokens expired without a charge", // idle: reserves, none measured
		"principal-hours  max hour  hours over  above cap  would-429  denied  holds    held  expired  by reservations",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
	plain := out[strings.Index(out, "budget plain"):]
	if strings.Contains(plain, "reservations") || strings.Contains(plain, "holds") {
		t.Errorf("a budget without reserve or holds shows reservations:\n%s", plain)
	}
	for name, w := range map[string]Writer{"markdown": WriteMarkdown, "html": WriteHTML} {
		var buf bytes.Buffer
		if err := w(&buf, r); err != nil {
			t.Fatal(err)
		}
		got := buf.String()
		if !strings.Contains(got, "Reservations (reserve 5,000 tokens): 4 holds, 20,000 tokens held, 5,000 tokens expired without a charge") ||
			strings.Count(got, "expired without a charge") != 4 { // big's two caps, hourly, idle: the override's are in its table
			t.Errorf("%s report:\n%s", name, got)
		}
	}
}
