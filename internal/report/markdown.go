package report

import (
	"io"
	"strings"
)

// WriteMarkdown writes the report for a pull request or an issue: a summary
// table of budgets, then a table per budget and day.
func WriteMarkdown(w io.Writer, r *Report) error {
	ew := &errWriter{w: w}
	ew.printf("# Shadow measurements %s..%s\n\n", r.From, r.To)
	ew.printf("%d days, generated %s. Suggested caps keep at most %s of principal-days over the cap.\n\n", r.Days, r.GeneratedAt.Format("2006-01-02T15:04:05Z"), pct(r.TargetLimitedShare))
	ew.printf("| budget | mode | cap | days | principals | p50 | p95 | p99 | max | over cap | above cap | would-be 429s | denied | suggested cap |\n")
	ew.printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range r.Budgets {
		b := &r.Budgets[i]
		s := b.Summary
		ew.printf("| %s | %s | %s | %d/%d | %d | %s | %s | %s | %s | %d (%s) | %s | %d | %d | %s |\n",
			md(b.Name), md(b.Mode), b.capOf(), b.DaysCovered, r.Days, s.Principals, b.amount(s.P50), b.amount(s.P95), b.amount(s.P99), b.amount(s.Max),
			s.OverCap, pct(s.LimitedShare), b.amount(s.TokensAboveCap), s.Would429, s.Denied, b.amount(b.SuggestedCap))
	}
	for i := range r.Budgets {
		b := &r.Budgets[i]
		ew.printf("\n## %s\n\n", md(b.Name))
		ew.printf("| day | principals | p50 | p95 | p99 | max | over cap | above cap | would-be 429s | denied |\n")
		ew.printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, d := range b.PerDay {
			ew.printf("| %s | %d | %s | %s | %s | %s | %d | %s | %d | %d |\n", d.Date, d.Principals, b.amount(d.P50), b.amount(d.P95), b.amount(d.P99), b.amount(d.Max), d.OverCap, b.amount(d.TokensAboveCap), d.Would429, d.Denied)
		}
	}
	if len(r.Warnings) > 0 {
		ew.printf("\n## Warnings\n\n")
		for _, warn := range r.Warnings {
			ew.printf("- %s\n", md(warn))
		}
	}
	return ew.err
}

// md escapes the characters that would break a table cell or add markup.
func md(s string) string {
	r := strings.NewReplacer("|", `\|`, "\n", " ", "*", `\*`, "_", `\_`, "`", "\\`", "<", "&lt;", ">", "&gt;", "[", `\[`, "]", `\]`)
	return r.Replace(s)
}
