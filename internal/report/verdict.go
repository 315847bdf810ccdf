package report

import (
	"fmt"

	"github.com/budgetgen/budgetgen/internal/ledger"
)

// capVerdict says whether a cap is ready to be enforced: measured on enough
// full days (a week or month in full, or a projection from at least as many
// days), with a share of principal-windows over it under MaxLimitedShare.
// promote --evidence applies the same rules against the shadow clock.
func capVerdict(c *Cap, mode string, o Options) Verdict {
	if mode == ModeEnforce {
		return Verdict{Status: VerdictEnforced}
	}
	var v Verdict
	if c.NoData != "" {
		v.Reasons = append(v.Reasons, c.NoData)
	}
	if c.Cap == 0 {
		v.Reasons = append(v.Reasons, "cap unknown: report with --spec")
	}
	switch p := c.Window; {
	case p == ledger.PeriodDay.String() || p == ledger.PeriodHour.String():
		if c.DaysCovered < o.RequiredDays && c.NoData == "" {
			v.Reasons = append(v.Reasons, fmt.Sprintf("measured on %d of the %d full days a promotion needs", c.DaysCovered, o.RequiredDays))
		}
	case c.Judged.Projection != nil:
		pj := c.Judged.Projection
		v.Notes = append(v.Notes, fmt.Sprintf("judged on a projection of %s (x%.2f from %.1f days measured)", pj.Window, pj.Factor, pj.ObservedHours/24))
		if pj.ObservedHours < float64(o.RequiredDays*24) {
			v.Reasons = append(v.Reasons, fmt.Sprintf("only %.1f days of %s measured; a promotion needs %d", pj.ObservedHours/24, pj.Window, o.RequiredDays))
		}
	}
	windows, over := judgedShare(c)
	if windows > 0 {
		if share := float64(over) / float64(windows); share >= o.MaxLimitedShare {
			v.Reasons = append(v.Reasons, fmt.Sprintf("%s of %s principal-%ss over the cap (%s), not under %s: raise it to the suggested %s",
				group(uint64(over)), group(uint64(windows)), c.Window, pct(share), pct(o.MaxLimitedShare), amountText(c.SuggestedCap, c.Measure, c.Currency)))
		}
	}
	if n := reserveOnlyDenials(c); n > 0 {
		v.Notes = append(v.Notes, fmt.Sprintf("reservations alone caused %s of its 429s (would-be or real): the cap was not yet spent, the holds of unfinished requests filled it; "+
			"enforced, a principal's concurrent requests are denied that early (lower reserve if that is not wanted)", group(n)))
	}
	v.Status = VerdictReady
	if len(v.Reasons) > 0 {
		v.Status = VerdictNotYet
	}
	return v
}

// reserveOnlyDenials counts the cap's 429s (would-be or real) that only its
// reservations caused, override principals' included. They do not hold a
// promotion back: they are what a reserve is for (a fan-out stopped before
// it passes the cap), but a team must see them before it enforces, since
// to the principal they look like a cap reached early.
func reserveOnlyDenials(c *Cap) uint64 {
	n := c.Summary.ReserveDenied
	for _, ov := range c.Overridden {
		n += ov.Summary.ReserveDenied
	}
	return n
}

// judgedShare counts the principal-windows a verdict weighs, override
// principals' included (their rules are enforced too): every judged window
// but today's partial one, or the projected window.
func judgedShare(c *Cap) (windows, over int) {
	add := func(ws []WindowStats) {
		for _, w := range ws {
			if !w.Partial || c.Judged.Projection != nil {
				windows += w.PrincipalWindows
				over += w.OverCap
			}
		}
	}
	add(c.PerWindow)
	for _, ov := range c.Overridden {
		add(ov.PerWindow)
	}
	return windows, over
}

// ModeEnforce is the spec's enforce mode.
const ModeEnforce = "enforce"

// budgetVerdict is ready when every cap is, enforced when the budget is;
// its reasons name the caps.
func budgetVerdict(b *Budget) Verdict {
	if b.Mode == ModeEnforce {
		return Verdict{Status: VerdictEnforced}
	}
	v := Verdict{Status: VerdictReady}
	for _, c := range b.Caps {
		label := capLabel(c.Window, c.Measure, c.Currency)
		for _, r := range c.Verdict.Reasons {
			v.Reasons = append(v.Reasons, label+": "+r)
		}
		for _, n := range c.Verdict.Notes {
			v.Notes = append(v.Notes, label+": "+n)
		}
	}
	if len(b.Caps) == 0 {
		v.Reasons = append(v.Reasons, "no caps measured")
	}
	if len(v.Reasons) > 0 {
		v.Status = VerdictNotYet
	}
	return v
}

// verdictText is a verdict in a few words: "ready to promote", "not yet: ...".
func verdictText(v Verdict) string {
	switch v.Status {
	case VerdictReady:
		return "ready to promote"
	case VerdictEnforced:
		return "enforced"
	}
	return "not yet"
}
