package week

// The reserving budget of the simulated week: per-agent holds 20,000 tokens
// for each admitted, unfinished call against a 60,000-token day. A steady
// agent's calls come one at a time (each hold released by its own charge);
// on day 5 an agent fans out four calls of 15,000 whose checks all arrive
// before the first charge (the fourth is over only because of the three
// holds: a would-be 429 due to reservations alone); on day 6 an agent's first
// call loses its charge (a client reset) and its hold expires, found by its
// next call hours later. The test models the holds itself and checks the
// report the real engine's ledger gives.

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/charge"
	"github.com/budgetgen/budgetgen/internal/report"
)

const (
	agentCap     = 60_000
	agentReserve = 20_000
)

// agentsFirst are per-agent's calls at the start of day k.
func agentsFirst(k int) []request {
	agent := func(p string, tok uint64, ph callPhase, together bool) request {
		return request{"x-agent", p, "per-agent", tok, 0, ph, together}
	}
	var out []request
	if k == 6 {
		out = append(out, agent("agent-lost", 10_000, checkOnly, false)) // its charge never comes
	}
	if k == 5 {
		for i := range 4 {
			out = append(out, agent("agent-fan", 15_000, checkOnly, i > 0))
		}
		for range 4 {
			out = append(out, agent("agent-fan", 15_000, chargeOnly, true))
		}
	}
	return append(out, agent("agent-steady", 10_000, bothPhases, false), agent("agent-steady", 10_000, bothPhases, false))
}

// agentsLast are per-agent's calls at the end of day k.
func agentsLast(k int) []request {
	out := []request{{"x-agent", "agent-steady", "per-agent", 10_000, 0, bothPhases, false}}
	if k == 6 {
		for range 2 {
			out = append(out, request{"x-agent", "agent-lost", "per-agent", 10_000, 0, bothPhases, false})
		}
	}
	return out
}

// reserveModel is what the test expects of per-agent's holds: per
// principal and day the times its unreleased holds were placed, per day the
// ledger's counts.
type reserveModel struct {
	open   map[string][]time.Time
	perDay map[int]*report.Stats
}

func newReserveModel() *reserveModel {
	return &reserveModel{open: map[string][]time.Time{}, perDay: map[int]*report.Stats{}}
}

// call applies one request's phases at at, used being the principal's
// counter for the day before it, and returns its would-be 429s. A check is
// admitted iff used + held < cap, holding the reserve; a charge releases a
// hold; a hold older than the expiry when its counter is next touched is
// expired (the calls here are hours or no time apart, so the store's
// expiry between half and all of it cannot tell them apart).
func (m *reserveModel) call(r request, k int, at time.Time, used uint64) uint64 {
	key := fmt.Sprint(r.principal, "/", k)
	day := m.perDay[k]
	if day == nil {
		day = &report.Stats{}
		m.perDay[k] = day
	}
	live := m.open[key][:0]
	for _, placed := range m.open[key] {
		if at.Sub(placed) >= charge.DefaultHoldExpiry {
			day.Expired += agentReserve
			continue
		}
		live = append(live, placed)
	}
	m.open[key] = live
	var would uint64
	if r.phase != chargeOnly {
		if used+uint64(len(live))*agentReserve < agentCap {
			m.open[key] = append(m.open[key], at)
			day.Holds++
			day.Held += agentReserve
		} else {
			would = 1
			if used <= agentCap {
				day.ReserveDenied++
			}
		}
	}
	if r.phase != checkOnly && len(m.open[key]) > 0 {
		m.open[key] = m.open[key][1:]
	}
	return would
}

// total is the model's counts over days 1..7.
func (m *reserveModel) total() report.Stats {
	var s report.Stats
	for k := 1; k <= 7; k++ {
		if d := m.perDay[k]; d != nil {
			s.Holds, s.Held, s.Expired, s.ReserveDenied = s.Holds+d.Holds, s.Held+d.Held, s.Expired+d.Expired, s.ReserveDenied+d.ReserveDenied
		}
	}
	return s
}

func reservations(s report.Stats) [4]uint64 {
	return [4]uint64{s.Holds, s.Held, s.Expired, s.ReserveDenied}
}

// checkReservations: per-agent's reservations, in total and per day, are
// the model's (and not trivially zero: the fan-out's denial and the lost
// call's expired hold are in them); a budget without reserve holds nothing.
func checkReservations(t *testing.T, b report.Budget, exp expected) {
	t.Helper()
	if b.Name != "per-agent" {
		for _, c := range b.Caps {
			if c.Summary.Holds != 0 || c.Summary.Held != 0 || c.Summary.Expired != 0 || c.Summary.ReserveDenied != 0 || b.Reserve != "" {
				t.Errorf("budget %s (no reserve) has reservations: %+v", b.Name, c.Summary)
			}
		}
		return
	}
	if b.Reserve != "20000" || len(b.Caps) != 1 {
		t.Fatalf("per-agent: reserve %q, caps %+v", b.Reserve, b.Caps)
	}
	c := b.Caps[0]
	want := exp.res.total()
	if got := reservations(c.Summary); got != reservations(want) || want.ReserveDenied == 0 || want.Expired == 0 {
		t.Errorf("per-agent holds, held, expired, denials by reservations = %v, want %v", got, reservations(want))
	}
	if c.Summary.Would429 != exp.would429["per-agent"] {
		t.Errorf("per-agent would-be 429s %d, want %d", c.Summary.Would429, exp.would429["per-agent"])
	}
	for k := 1; k <= 7; k++ {
		var w report.Stats
		if d := exp.res.perDay[k]; d != nil {
			w = *d
		}
		if got := reservations(c.PerWindow[k-1].Stats); got != reservations(w) {
			t.Errorf("per-agent day %d (%s): %v, want %v", k, c.PerWindow[k-1].Window, got, reservations(w))
		}
	}
	t.Logf("per-agent reservations: %v (holds, held, expired, denials by reservations)", reservations(c.Summary))
}

// checkReservationText: the text report says per-agent's reservations in
// one line, and the denial by reservations beside the would-be 429s.
func checkReservationText(t *testing.T, rep *report.Report) {
	t.Helper()
	var buf bytes.Buffer
	if err := report.WriteText(&buf, rep); err != nil {
		t.Fatal(err)
	}
	var s report.Stats
	for _, b := range rep.Budgets {
		if b.Name == "per-agent" {
			s = b.Caps[0].Summary
		}
	}
	out := buf.String()
	line := fmt.Sprintf("reservations (reserve 20,000 tokens): %d holds, %s tokens held, %s tokens expired without a charge", s.Holds, groupDigits(s.Held), groupDigits(s.Expired))
	if !strings.Contains(out, line) || !strings.Contains(out, fmt.Sprintf("(%d by reservations)", s.ReserveDenied)) || strings.Count(out, "reservations (") != 1 {
		t.Errorf("text report lacks %q:\n%s", line, out)
	}
}

func groupDigits(n uint64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
