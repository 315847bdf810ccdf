package report

import (
	"io"
	"strings"

	"github.com/budgetgen/budgetgen/internal/safetext"
)

// WriteMarkdown writes the report for a pull request or an issue: a summary
// table of budgets, then per budget a table per day, the principals over the
// cap and the override principals.
func WriteMarkdown(w io.Writer, r *Report) error {
	ew := &errWriter{w: w}
	ew.printf("# Shadow measurements %s\n\n", md(windowText(r)))
	ew.printf("%s, generated %s. Suggested caps keep at most %s of principal-days over the cap; a cap based on a peak adds a headroom of x%.2f.\n\n", daysText(r), r.GeneratedAt.Format("2006-01-02T15:04:05Z"), pct(r.TargetLimitedShare), r.Headroom)
	if r.NoData != "" {
		ew.printf("**%s**\n\n", md(r.NoData))
	}
	ew.printf("| budget | mode | cap | days | principals | p50 | p95 | p99 | max | over cap | above cap | would-be 429s | denied | suggested cap |\n")
	ew.printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range r.Budgets {
		b := &r.Budgets[i]
		s := b.Summary
		ew.printf("| %s | %s | %s | %d/%d | %d | %s | %s | %s | %s | %d (%s) | %s | %d | %d | %s |\n",
			md(b.Name), md(b.Mode), b.capOf(), b.DaysCovered, r.Days, s.Principals, b.amount(s.P50), b.amount(s.P95), b.amount(s.P99), b.amount(s.Max),
			s.OverCap, pct(s.LimitedShare), b.amount(s.TokensAboveCap), s.Would429, s.Denied, suggestionText(b.SuggestedCap, b.NoData))
	}
	for i := range r.Budgets {
		b := &r.Budgets[i]
		ew.printf("\n## %s\n\n", md(b.Name))
		if b.NoData != "" {
			ew.printf("%s.\n\n", md(b.NoData))
		} else {
			ew.printf("Suggested cap **%s**: %s.\n\n", b.amount(b.SuggestedCap), md(b.SuggestionBasis))
			ew.printf("| day | principals | p50 | p95 | p99 | max | over cap | above cap | would-be 429s | denied |\n")
			ew.printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
			for _, d := range b.PerDay {
				ew.printf("| %s | %d | %s | %s | %s | %s | %d | %s | %d | %d |\n", md(dayText(d)), d.Principals, b.amount(d.P50), b.amount(d.P95), b.amount(d.P99), b.amount(d.Max), d.OverCap, b.amount(d.TokensAboveCap), d.Would429, d.Denied)
			}
		}
		if b.OverCapPrincipalsTotal > 0 {
			ew.printf("\nPrincipals over the cap (%s):\n\n", topText(len(b.OverCapPrincipals), b.OverCapPrincipalsTotal))
			ew.printf("| principal | cap | days over | above cap | max day | would-be 429s |\n")
			ew.printf("|---|---:|---|---:|---:|---:|\n")
			for _, p := range b.OverCapPrincipals {
				ew.printf("| %s | %s | %d (%s) | %s | %s | %s |\n", md(p.Principal), b.amount(p.Cap), len(p.DaysOver), strings.Join(p.DaysOver, ", "), b.amount(p.TokensAboveCap), b.amount(p.MaxDay), md(would429Text(p)))
			}
		}
		if len(b.Overridden) > 0 {
			ew.printf("\nOverride principals, each against its own cap:\n\n")
			ew.printf("| principal | own cap | days | max | over cap | above cap | would-be 429s | denied | suggested cap |\n")
			ew.printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
			for _, ov := range b.Overridden {
				s := ov.Summary
				ew.printf("| %s | %s | %d/%d | %s | %d | %s | %d | %d | %s |\n", md(ov.Principal), capText(ov.Cap), ov.DaysCovered, r.Days, b.amount(s.Max), s.OverCap, b.amount(s.TokensAboveCap), s.Would429, s.Denied, suggestionText(ov.SuggestedCap, ov.NoData))
			}
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

// suggestionText is the suggested cap, or "none" without data (never a 0
// that reads as "cap everything").
func suggestionText(c uint64, noData string) string {
	if noData != "" {
		return "none (no data)"
	}
	return group(c)
}

// md escapes the characters that would break a table cell or add markup.
func md(s string) string {
	r := strings.NewReplacer("|", `\|`, "\n", " ", "*", `\*`, "_", `\_`, "`", "\\`", "<", "&lt;", ">", "&gt;", "[", `\[`, "]", `\]`)
	return safetext.Inline(r.Replace(strings.ReplaceAll(s, "\r", " ")))
}
