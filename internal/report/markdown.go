package report

import (
	"fmt"
	"io"
	"strings"

	"github.com/budgetgen/budgetgen/internal/safetext"
)

// WriteMarkdown writes the report for a pull request or an issue: the
// summary table (one row per cap with its verdict), then per budget and cap
// a table per window, the principals over the cap, the outliers and the
// override principals.
func WriteMarkdown(w io.Writer, r *Report) error {
	ew := &errWriter{w: w}
	ew.printf("# Shadow measurements %s\n\n", md(windowText(r)))
	ew.printf("%s (%s), generated %s. Suggested caps keep at most %s of principal-windows over the cap; a cap based on a peak adds a headroom of x%.2f. A cap is ready to promote with under %s of principal-windows over it after %d full days.\n\n",
		daysText(r), md(r.TimeZone), r.GeneratedAt.Format("2006-01-02T15:04:05Z"), pct(r.TargetLimitedShare), r.Headroom, pct(r.MaxLimitedShare), r.RequiredDays)
	if r.NoData != "" {
		ew.printf("**%s**\n\n", md(r.NoData))
	}
	ew.printf("| budget | window | cap | mode | principals over | would-be 429s | suggested cap | verdict |\n")
	ew.printf("|---|---|---:|---|---:|---:|---:|---|\n")
	for _, s := range r.Summary {
		ew.printf("| %s | %s | %s | %s | %d | %d | %s | %s |\n", md(s.Budget), md(s.Window+projMark(s.Projection)), md(s.capText()), md(orDash(s.Mode)), s.PrincipalsOver, s.Would429, md(s.suggestedText()), md(verdictLine(s.Verdict)))
	}
	for i := range r.Budgets {
		b := &r.Budgets[i]
		ew.printf("\n## %s\n\n", md(b.Name))
		ew.printf("%s.\n", md(verdictLine(b.Verdict)))
		if b.NoData != "" {
			ew.printf("\n%s.\n", md(b.NoData))
		}
		for j := range b.Caps {
			writeMarkdownCap(ew, &b.Caps[j], b.Reserve)
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

func writeMarkdownCap(ew *errWriter, c *Cap, reserve string) {
	ew.printf("\n### %s %s\n\nJudged on %s.", md(c.capOf()), md(c.label()), md(c.Judged.Text))
	for _, n := range c.Verdict.Notes {
		ew.printf(" Note: %s.", md(n))
	}
	ew.printf("\n\n")
	if c.NoData != "" {
		ew.printf("%s.\n", md(c.NoData))
	} else {
		ew.printf("Suggested cap **%s**: %s.\n\n", md(c.amount(c.SuggestedCap)), md(c.SuggestionBasis))
		if text := c.reservationText(c.Summary, reserve); text != "" {
			ew.printf("%s; %d denials by reservations alone.\n\n", md(capitalize(text)), c.Summary.ReserveDenied)
		}
		writeMarkdownWindows(ew, c, c.reserving(reserve))
	}
	if c.OverCapPrincipalsTotal > 0 {
		ew.printf("\nPrincipals over the cap (%s):\n\n", topText(len(c.OverCapPrincipals), c.OverCapPrincipalsTotal))
		ew.printf("| principal | cap | %ss over | above cap | max %s | would-be 429s |\n", c.Window, c.Window)
		ew.printf("|---|---:|---|---:|---:|---:|\n")
		for _, p := range c.OverCapPrincipals {
			ew.printf("| %s | %s | %d (%s) | %s | %s | %s |\n", md(p.Principal), md(c.amount(p.Cap)), len(p.WindowsOver), md(strings.Join(p.WindowsOver, ", ")), md(c.amount(p.AboveCap)), md(c.amount(p.MaxWindow)), md(would429Text(p)))
		}
	}
	if len(c.Outliers) > 0 {
		ew.printf("\nOutliers (left out of the distribution):\n\n| principal | %s | usage | cap |\n|---|---|---:|---:|\n", c.Window)
		for _, o := range c.Outliers {
			ew.printf("| %s | %s | %s | %s |\n", md(o.Principal), md(o.Window), md(c.amount(o.Value)), md(c.amount(o.Cap)))
		}
	}
	if len(c.Overridden) > 0 {
		ew.printf("\nOverride principals, each against its own cap:\n\n")
		res := c.reserving(reserve)
		ew.printf("| principal | own cap | %ss | max | over cap | above cap | would-be 429s | denied | suggested cap |%s\n", c.Window, cond(res, " holds | held | expired | by reservations |"))
		ew.printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|%s\n", cond(res, "---:|---:|---:|---:|"))
		for _, ov := range c.Overridden {
			s := ov.Summary
			ew.printf("| %s | %s | %d | %s | %d | %s | %d | %d | %s |%s\n", md(ov.Principal), md(c.amount(ov.Cap)), ov.WindowsCovered, md(c.amount(s.Max)), s.OverCap, md(c.amount(s.AboveCap)), s.Would429, s.Denied, md(suggestionText(c, ov.SuggestedCap, ov.NoData)), cond(res, markdownReservations(c, s)))
		}
	}
}

// writeMarkdownWindows writes the table of windows (days for an hour cap),
// with the reservation columns when the cap shows reservations.
func writeMarkdownWindows(ew *errWriter, c *Cap, reserving bool) {
	resHead, resAlign := cond(reserving, " holds | held | expired | by reservations |"), cond(reserving, "---:|---:|---:|---:|")
	if c.PerDay != nil {
		ew.printf("| day | principal-hours | max hour | hours over | above cap | would-be 429s | denied |%s\n|---|---:|---:|---:|---:|---:|---:|%s\n", resHead, resAlign)
		for _, d := range c.PerDay {
			ew.printf("| %s | %d | %s | %d | %s | %d | %d |%s\n", md(dateText(d.Window, d.Partial)), d.PrincipalWindows, md(c.amount(d.Max)), d.OverCap, md(c.amount(d.AboveCap)), d.Would429, d.Denied, cond(reserving, markdownReservations(c, d.Stats)))
		}
		return
	}
	ew.printf("| %s | principals | p50 | p95 | p99 | max | over cap | above cap | would-be 429s | denied |%s\n", c.Window, resHead)
	ew.printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|%s\n", resAlign)
	for _, d := range c.PerWindow {
		ew.printf("| %s | %d | %s | %s | %s | %s | %d | %s | %d | %d |%s\n", md(dateText(d.Window, d.Partial)), d.Principals, md(c.amount(d.P50)), md(c.amount(d.P95)), md(c.amount(d.P99)), md(c.amount(d.Max)), d.OverCap, md(c.amount(d.AboveCap)), d.Would429, d.Denied, cond(reserving, markdownReservations(c, d.Stats)))
	}
}

// markdownReservations are the reservation cells of a table row.
func markdownReservations(c *Cap, s Stats) string {
	return fmt.Sprintf(" %d | %s | %s | %d |", s.Holds, md(c.amount(s.Held)), md(c.amount(s.Expired)), s.ReserveDenied)
}

// cond is s when ok, else "".
func cond(ok bool, s string) string {
	if ok {
		return s
	}
	return ""
}

// capitalize upper-cases a sentence's first letter.
func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// suggestionText is the suggested cap, or "none" without data (never a 0
// that reads as "cap everything").
func suggestionText(c *Cap, v uint64, noData string) string {
	if noData != "" {
		return "none (no data)"
	}
	return c.amount(v)
}

// md escapes the characters that would break a table cell or add markup.
func md(s string) string {
	r := strings.NewReplacer("|", `\|`, "\n", " ", "*", `\*`, "_", `\_`, "`", "\\`", "<", "&lt;", ">", "&gt;", "[", `\[`, "]", `\]`)
	return safetext.Inline(r.Replace(strings.ReplaceAll(s, "\r", " ")))
}
