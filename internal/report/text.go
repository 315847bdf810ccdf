package report

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteText writes a terminal-friendly report: one block per budget with a
// line per day.
func WriteText(w io.Writer, r *Report) error {
	ew := &errWriter{w: w}
	ew.printf("budgetgen report %s..%s (%d days, generated %s)\n", r.From, r.To, r.Days, r.GeneratedAt.Format("2006-01-02T15:04:05Z"))
	for i := range r.Budgets {
		b := &r.Budgets[i]
		ew.printf("\nbudget %s", b.Name)
		if b.Mode != "" {
			ew.printf(" (%s)", b.Mode)
		}
		ew.printf(": cap %s/day, %d of %d days covered\n", b.capOf(), b.DaysCovered, r.Days)
		s := b.Summary
		ew.printf("  principals %d, principal-days %d, p50 %s, p95 %s, p99 %s, max %s\n",
			s.Principals, s.PrincipalDays, b.amount(s.P50), b.amount(s.P95), b.amount(s.P99), b.amount(s.Max))
		ew.printf("  over cap %d principal-days (%s), tokens above cap %s, would-be 429s %d, denied %d\n",
			s.OverCap, pct(s.LimitedShare), b.amount(s.TokensAboveCap), s.Would429, s.Denied)
		ew.printf("  suggested cap for at most %s of principal-days limited: %s\n", pct(r.TargetLimitedShare), b.amount(b.SuggestedCap))
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "  day\tprincipals\tp50\tp95\tp99\tmax\tover cap\tabove cap\twould-429\tdenied\t\n")
		for _, d := range b.PerDay {
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t\n", d.Date, d.Principals, b.amount(d.P50), b.amount(d.P95), b.amount(d.P99), b.amount(d.Max), d.OverCap, b.amount(d.TokensAboveCap), d.Would429, d.Denied)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Budgets) == 0 {
		ew.printf("\nno budgets and no measurements in this window\n")
	}
	for _, warn := range r.Warnings {
		ew.printf("\nwarning: %s", warn)
	}
	if len(r.Warnings) > 0 {
		ew.printf("\n")
	}
	return ew.err
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

func (e *errWriter) printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }
