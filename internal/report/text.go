package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/budgetgen/budgetgen/internal/safetext"
)

// WriteText writes a terminal-friendly report: the summary table first (one
// line per cap with its verdict), then per budget and cap the numbers, a line
// per window (per day for an hour cap), the principals over the cap, the
// outliers and each override principal.
func WriteText(w io.Writer, r *Report) error {
	ew := &errWriter{w: w}
	ew.printf("budgetgen report %s (%s, %s, generated %s)\n", windowText(r), daysText(r), r.TimeZone, r.GeneratedAt.Format("2006-01-02T15:04:05Z"))
	if r.NoData != "" {
		ew.printf("\n%s\n", r.NoData)
	}
	if err := writeTextSummary(ew, r); err != nil {
		return err
	}
	for i := range r.Budgets {
		if err := writeTextBudget(ew, r, &r.Budgets[i]); err != nil {
			return err
		}
	}
	if len(r.Budgets) == 0 && r.NoData == "" {
		ew.printf("\nno budgets and no measurements in this window\n")
	}
	for _, warn := range r.Warnings {
		ew.printf("\nwarning: %s", safetext.Inline(warn))
	}
	if len(r.Warnings) > 0 {
		ew.printf("\n")
	}
	return ew.err
}

func writeTextSummary(ew *errWriter, r *Report) error {
	if len(r.Summary) == 0 {
		return nil
	}
	ew.printf("\nsummary:\n")
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	_, _ = fmt.Fprintf(tw, "  budget\twindow\tcap\tmode\tprincipals over\twould-be 429s\tsuggested cap\tverdict\n") // tabwriter buffers; Flush returns the write error
	for _, s := range r.Summary {
		_, _ = fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", safetext.Inline(s.Budget), s.Window+projMark(s.Projection), s.capText(), orDash(s.Mode), s.PrincipalsOver, s.Would429, s.suggestedText(), verdictLine(s.Verdict)) // tabwriter buffers; Flush returns the write error
	}
	return tw.Flush()
}

// projMark flags a cap judged on a projection.
func projMark(p bool) string {
	if p {
		return " (projected)"
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// verdictLine is a verdict with its reasons on one line.
func verdictLine(v Verdict) string {
	s := verdictText(v)
	if len(v.Reasons) > 0 {
		s += ": " + strings.Join(v.Reasons, "; ")
	}
	return safetext.Inline(s)
}

func writeTextBudget(ew *errWriter, r *Report, b *Budget) error {
	ew.printf("\nbudget %s", safetext.Inline(b.Name)) // names come from the ledger: escaped
	if b.Mode != "" {
		ew.printf(" (%s)", safetext.Inline(b.Mode))
	}
	ew.printf(": %s\n", verdictLine(b.Verdict))
	if b.NoData != "" {
		ew.printf("  %s\n", b.NoData)
	}
	if len(b.Daily) > 0 {
		writeTextDaily(ew, b)
	}
	for i := range b.Caps {
		if err := writeTextCap(ew, b, &b.Caps[i]); err != nil {
			return err
		}
	}
	return nil
}

func writeTextDaily(ew *errWriter, b *Budget) {
	ew.printf("  per day:")
	for _, d := range b.Daily {
		ew.printf(" %s %s tokens", dateText(d.Date, d.Partial), group(d.Tokens))
		if d.Currency != "" {
			ew.printf(" (%s)", amountText(d.Money, MeasureCost, d.Currency))
		}
		ew.printf(";")
	}
	ew.printf("\n")
}

func writeTextCap(ew *errWriter, b *Budget, c *Cap) error {
	ew.printf("  cap %s %s, judged on %s\n", c.capOf(), c.label(), c.Judged.Text)
	for _, n := range c.Verdict.Notes {
		ew.printf("    note: %s\n", n)
	}
	if c.NoData != "" && len(c.Overridden) == 0 {
		ew.printf("    %s\n", c.NoData)
		return nil
	}
	if c.NoData != "" {
		ew.printf("    default rule: %s\n", c.NoData)
	} else {
		writeTextStats(ew, "    ", c.Window, c.Summary, c.amount, c.reservationText(c.Summary, b.Reserve))
		ew.printf("    suggested cap: %s (%s)\n", c.amount(c.SuggestedCap), c.SuggestionBasis)
		if err := writeTextWindows(ew, c, c.reserving(b.Reserve)); err != nil {
			return err
		}
	}
	if err := writeTextOver(ew, c); err != nil {
		return err
	}
	for _, o := range c.Outliers {
		ew.printf("    outlier: %s %s %s (cap %s)\n", oneLine(o.Principal), o.Window, c.amount(o.Value), c.amount(o.Cap))
	}
	for _, ov := range c.Overridden {
		ew.printf("    override %s: own cap %s, %d %ss covered\n", oneLine(ov.Principal), c.amount(ov.Cap), ov.WindowsCovered, c.Window)
		if ov.NoData != "" {
			ew.printf("      %s\n", ov.NoData)
			continue
		}
		writeTextStats(ew, "      ", c.Window, ov.Summary, c.amount, c.reservationText(ov.Summary, b.Reserve))
		ew.printf("      suggested cap: %s (%s)\n", c.amount(ov.SuggestedCap), ov.SuggestionBasis)
	}
	return nil
}

// writeTextStats writes a population's numbers, and its reservations line
// when there is one.
func writeTextStats(ew *errWriter, indent, window string, s Stats, amount func(uint64) string, reservations string) {
	ew.printf("%sprincipals %d, principal-%ss %d, p50 %s, p95 %s, p99 %s, max %s, total %s\n",
		indent, s.Principals, window, s.PrincipalWindows, amount(s.P50), amount(s.P95), amount(s.P99), amount(s.Max), amount(s.Total))
	ew.printf("%sover cap %d principal-%ss (%s), above cap %s, would-be 429s %d, denied %d",
		indent, s.OverCap, window, pct(s.LimitedShare), amount(s.AboveCap), s.Would429, s.Denied)
	if s.ReserveDenied > 0 {
		ew.printf(" (%d by reservations)", s.ReserveDenied)
	}
	ew.printf("\n")
	if reservations != "" {
		ew.printf("%s%s\n", indent, reservations)
	}
}

// writeTextWindows writes a line per window, or per day for an hour cap,
// with the reservation columns when the cap shows reservations.
func writeTextWindows(ew *errWriter, c *Cap, reserving bool) error {
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	resHead, resRow := "", func(WindowStats) string { return "" }
	if reserving {
		resHead = "holds\theld\texpired\tby reservations\t"
		resRow = func(d WindowStats) string {
			return fmt.Sprintf("%d\t%s\t%s\t%d\t", d.Holds, c.amount(d.Held), c.amount(d.Expired), d.ReserveDenied)
		}
	}
	rows, first := c.PerWindow, c.Window
	if c.PerDay != nil {
		rows, first = c.PerDay, "day"
		_, _ = fmt.Fprintf(tw, "    %s\tprincipal-hours\tmax hour\thours over\tabove cap\twould-429\tdenied\t%s\n", first, resHead) // tabwriter buffers; Flush returns the write error
		for _, d := range rows {
			_, _ = fmt.Fprintf(tw, "    %s\t%d\t%s\t%d\t%s\t%d\t%d\t%s\n", dateText(d.Window, d.Partial), d.PrincipalWindows, c.amount(d.Max), d.OverCap, c.amount(d.AboveCap), d.Would429, d.Denied, resRow(d)) // tabwriter buffers; Flush returns the write error
		}
		return tw.Flush()
	}
	_, _ = fmt.Fprintf(tw, "    %s\tprincipals\tp50\tp95\tp99\tmax\tover cap\tabove cap\twould-429\tdenied\t%s\n", first, resHead) // tabwriter buffers; Flush returns the write error
	for _, d := range rows {
		_, _ = fmt.Fprintf(tw, "    %s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\n", dateText(d.Window, d.Partial), d.Principals, c.amount(d.P50), c.amount(d.P95), c.amount(d.P99), c.amount(d.Max), d.OverCap, c.amount(d.AboveCap), d.Would429, d.Denied, resRow(d)) // tabwriter buffers; Flush returns the write error
	}
	return tw.Flush()
}

func writeTextOver(ew *errWriter, c *Cap) error {
	if c.OverCapPrincipalsTotal == 0 {
		return nil
	}
	ew.printf("    principals over the cap (%s):\n", topText(len(c.OverCapPrincipals), c.OverCapPrincipalsTotal))
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = fmt.Fprintf(tw, "      principal\tcap\t%ss over\tabove cap\tmax %s\twould-429\t\n", c.Window, c.Window) // tabwriter buffers; Flush returns the write error
	for _, p := range c.OverCapPrincipals {
		_, _ = fmt.Fprintf(tw, "      %s\t%s\t%d\t%s\t%s\t%s\t\n", oneLine(p.Principal), c.amount(p.Cap), len(p.WindowsOver), c.amount(p.AboveCap), c.amount(p.MaxWindow), would429Text(p)) // tabwriter buffers; Flush returns the write error
	}
	return tw.Flush()
}

// windowText is "2026-10-17..2026-10-23", plus today when included.
func windowText(r *Report) string {
	s := r.From + ".." + r.To
	if r.PartialDay != "" {
		s += " + " + r.PartialDay + " (partial: today so far)"
	}
	return s
}

func daysText(r *Report) string {
	if r.PartialDay != "" {
		return fmt.Sprintf("%d full days and today so far", r.Days)
	}
	return fmt.Sprintf("%d days", r.Days)
}

func dateText(w string, partial bool) string {
	if partial {
		return w + " (partial)"
	}
	return w
}

func topText(shown, total int) string {
	if shown < total {
		return fmt.Sprintf("top %d of %d by usage above the cap", shown, total)
	}
	return fmt.Sprintf("%d, by usage above the cap", total)
}

// oneLine keeps a principal (any bytes a header carried) on one line.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}

// errWriter keeps the first write error so formatting code stays linear.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(e, format, args...) /* errWriter keeps the first error for the caller */
}
