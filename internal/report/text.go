package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/budgetgen/budgetgen/internal/safetext"
)

// WriteText writes a terminal-friendly report: one block per budget with a
// line per day, the principals over the cap and each override principal.
func WriteText(w io.Writer, r *Report) error {
	ew := &errWriter{w: w}
	ew.printf("budgetgen report %s (%s, generated %s)\n", windowText(r), daysText(r), r.GeneratedAt.Format("2006-01-02T15:04:05Z"))
	if r.NoData != "" {
		ew.printf("\n%s\n", r.NoData)
	}
	for i := range r.Budgets {
		b := &r.Budgets[i]
		ew.printf("\nbudget %s", safetext.Inline(b.Name)) // names come from the ledger: escaped
		if b.Mode != "" {
			ew.printf(" (%s)", safetext.Inline(b.Mode))
		}
		ew.printf(": cap %s/day, %d of %d days covered\n", b.capOf(), b.DaysCovered, r.Days)
		if b.NoData != "" && len(b.Overridden) == 0 {
			ew.printf("  %s\n", b.NoData)
			continue
		}
		if b.NoData != "" {
			ew.printf("  default rule: %s\n", b.NoData)
		} else {
			writeTextStats(ew, "  ", b.Summary, b.amount)
			ew.printf("  suggested cap: %s (%s)\n", b.amount(b.SuggestedCap), b.SuggestionBasis)
			if err := writeTextDays(ew, b.PerDay, b.amount); err != nil {
				return err
			}
		}
		if b.OverCapPrincipalsTotal > 0 {
			ew.printf("  principals over the cap (%s):\n", topText(len(b.OverCapPrincipals), b.OverCapPrincipalsTotal))
			tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
			_, _ = fmt.Fprintf(tw, "    principal\tcap\tdays over\tabove cap\tmax day\twould-429\t\n") // tabwriter buffers; Flush returns the write error
			for _, p := range b.OverCapPrincipals {
				_, _ = fmt.Fprintf(tw, "    %s\t%s\t%d\t%s\t%s\t%s\t\n", oneLine(p.Principal), b.amount(p.Cap), len(p.DaysOver), b.amount(p.TokensAboveCap), b.amount(p.MaxDay), would429Text(p)) // tabwriter buffers; Flush returns the write error
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		for _, ov := range b.Overridden {
			ew.printf("  override %s: own cap %s/day, %d of %d days covered\n", oneLine(ov.Principal), capText(ov.Cap), ov.DaysCovered, r.Days)
			if ov.NoData != "" {
				ew.printf("    %s\n", ov.NoData)
				continue
			}
			writeTextStats(ew, "    ", ov.Summary, b.amount)
			ew.printf("    suggested cap: %s (%s)\n", b.amount(ov.SuggestedCap), ov.SuggestionBasis)
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

func writeTextStats(ew *errWriter, indent string, s Stats, amount func(uint64) string) {
	ew.printf("%sprincipals %d, principal-days %d, p50 %s, p95 %s, p99 %s, max %s\n",
		indent, s.Principals, s.PrincipalDays, amount(s.P50), amount(s.P95), amount(s.P99), amount(s.Max))
	ew.printf("%sover cap %d principal-days (%s), tokens above cap %s, would-be 429s %d, denied %d\n",
		indent, s.OverCap, pct(s.LimitedShare), amount(s.TokensAboveCap), s.Would429, s.Denied)
}

func writeTextDays(ew *errWriter, days []DayStats, amount func(uint64) string) error {
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = fmt.Fprintf(tw, "  day\tprincipals\tp50\tp95\tp99\tmax\tover cap\tabove cap\twould-429\tdenied\t\n") // tabwriter buffers; Flush returns the write error
	for _, d := range days {
		_, _ = fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t\n", dayText(d), d.Principals, amount(d.P50), amount(d.P95), amount(d.P99), amount(d.Max), d.OverCap, amount(d.TokensAboveCap), d.Would429, d.Denied) // tabwriter buffers; Flush returns the write error
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

func dayText(d DayStats) string {
	if d.Partial {
		return d.Date + " (partial)"
	}
	return d.Date
}

func topText(shown, total int) string {
	if shown < total {
		return fmt.Sprintf("top %d of %d by tokens above the cap", shown, total)
	}
	return fmt.Sprintf("%d, by tokens above the cap", total)
}

func would429Text(p PrincipalOver) string {
	if p.Would429Exact {
		return fmt.Sprintf("%d", p.Would429)
	}
	return fmt.Sprintf(">=%d", p.Would429)
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
