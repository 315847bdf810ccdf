package report

import (
	"fmt"
	"html/template"
	"io"
	"strings"
)

// The HTML report is one self-contained file: inline CSS and one inline SVG
// per budget, no script, no external asset, so it can be attached to a ticket
// or served from anywhere.

const (
	chartW, chartH         = 640.0, 220.0
	chartLeft, chartBottom = 56.0, 28.0
	chartTop, chartRight   = 16.0, 16.0
	chartBins              = 24
)

type htmlBar struct {
	X, Y, W, H float64
	Title      string
}

type htmlLine struct {
	X     float64
	Label string
}

type htmlChart struct {
	Bars                                     []htmlBar
	Cap, Suggested                           *htmlLine
	XTicks                                   []htmlLine
	YMax                                     int
	PlotTop, PlotBottom, PlotLeft, PlotRight float64
}

type htmlBudget struct {
	Budget
	Chart *htmlChart
}

type htmlPage struct {
	*Report
	Items []htmlBudget
}

var funcs = template.FuncMap{
	"group": group,
	"pct":   pct,
	"cap":   capText,
	"f":     func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"w":     func() float64 { return chartW },
	"win":   windowText,
	"dtext": daysText,
	"day":   dayText,
	"w429":  would429Text,
	"sugg":  suggestionText,
	"join":  func(s []string) string { return strings.Join(s, ", ") },
	"top":   topText,
	"h":     func() float64 { return chartH },
}

var page = template.Must(template.New("report").Funcs(funcs).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>budgetgen report {{win .Report}}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:2px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}
svg.chart{background:#fafafa;border:1px solid #ddd}
.bar{fill:#4a7bd0}
.cap{stroke:#c0392b;stroke-width:2}
.suggested{stroke:#27ae60;stroke-width:2;stroke-dasharray:6 4}
.axis{stroke:#888}
text{font-size:11px;fill:#444}
.warn{color:#a15c00}
tr.partial td{font-style:italic;color:#666}
.nodata{font-weight:bold}
</style>
</head>
<body>
<h1>Shadow measurements {{win .Report}}</h1>
<p>{{dtext .Report}}, generated {{.GeneratedAt.Format "2006-01-02T15:04:05Z"}}. Suggested caps keep at most {{pct .TargetLimitedShare}} of principal-days over the cap; a cap based on a peak adds a headroom of x{{printf "%.2f" .Headroom}}.</p>
{{with .NoData}}<p class="nodata">{{.}}</p>
{{end}}{{range .Warnings}}<p class="warn">warning: {{.}}</p>
{{end}}{{range $it := .Items}}<section class="budget" id="budget-{{.Name}}">
<h2>{{.Name}}{{if .Mode}} ({{.Mode}}){{end}}</h2>
{{if .NoData}}<p class="nodata">Cap {{cap .Cap}} tokens/day: {{.NoData}}.</p>
{{else}}<p>Cap {{cap .Cap}} tokens/day; {{.DaysCovered}} of {{$.Days}} days covered; {{.Summary.Principals}} principals, {{.Summary.PrincipalDays}} principal-days.
Over the cap: {{.Summary.OverCap}} principal-days ({{pct .Summary.LimitedShare}}), {{group .Summary.TokensAboveCap}} tokens above it, {{.Summary.Would429}} would-be 429s, {{.Summary.Denied}} denied.
Suggested cap: <strong>{{group .SuggestedCap}}</strong> ({{.SuggestionBasis}}).</p>
{{end}}{{with .Chart}}<svg class="chart" data-budget="{{$it.Name}}" xmlns="http://www.w3.org/2000/svg" width="{{f w}}" height="{{f h}}" viewBox="0 0 {{f w}} {{f h}}" role="img" aria-label="distribution of daily usage per principal against the cap">
<title>Daily usage per principal-day against the cap</title>
<line class="axis" x1="{{f .PlotLeft}}" y1="{{f .PlotBottom}}" x2="{{f .PlotRight}}" y2="{{f .PlotBottom}}"/>
<line class="axis" x1="{{f .PlotLeft}}" y1="{{f .PlotTop}}" x2="{{f .PlotLeft}}" y2="{{f .PlotBottom}}"/>
<text x="{{f .PlotLeft}}" y="{{f .PlotTop}}" text-anchor="end" dx="-4" dy="4">{{.YMax}}</text>
<text x="{{f .PlotLeft}}" y="{{f .PlotBottom}}" text-anchor="end" dx="-4">0</text>
{{range .Bars}}<rect class="bar" x="{{f .X}}" y="{{f .Y}}" width="{{f .W}}" height="{{f .H}}"><title>{{.Title}}</title></rect>
{{end}}{{range .XTicks}}<text x="{{f .X}}" y="{{f $it.Chart.PlotBottom}}" dy="16" text-anchor="middle">{{.Label}}</text>
{{end}}{{with .Cap}}<line class="cap" x1="{{f .X}}" y1="{{f $it.Chart.PlotTop}}" x2="{{f .X}}" y2="{{f $it.Chart.PlotBottom}}"><title>{{.Label}}</title></line>
<text x="{{f .X}}" y="{{f $it.Chart.PlotTop}}" dx="4" dy="10">{{.Label}}</text>
{{end}}{{with .Suggested}}<line class="suggested" x1="{{f .X}}" y1="{{f $it.Chart.PlotTop}}" x2="{{f .X}}" y2="{{f $it.Chart.PlotBottom}}"><title>{{.Label}}</title></line>
<text x="{{f .X}}" y="{{f $it.Chart.PlotTop}}" dx="4" dy="24">{{.Label}}</text>
{{end}}</svg>
{{end}}{{if not .NoData}}<table class="days">
<tr><th>day</th><th>principals</th><th>p50</th><th>p95</th><th>p99</th><th>max</th><th>over cap</th><th>above cap</th><th>would-be 429s</th><th>denied</th></tr>
{{range .PerDay}}<tr{{if .Partial}} class="partial"{{end}}><td>{{day .}}</td><td>{{.Principals}}</td><td>{{group .P50}}</td><td>{{group .P95}}</td><td>{{group .P99}}</td><td>{{group .Max}}</td><td>{{.OverCap}}</td><td>{{group .TokensAboveCap}}</td><td>{{.Would429}}</td><td>{{.Denied}}</td></tr>
{{end}}</table>
{{end}}{{if .OverCapPrincipalsTotal}}<h3>Principals over the cap ({{top (len .OverCapPrincipals) .OverCapPrincipalsTotal}})</h3>
<table class="over">
<tr><th>principal</th><th>cap</th><th>days over</th><th>above cap</th><th>max day</th><th>would-be 429s</th></tr>
{{range .OverCapPrincipals}}<tr><td>{{.Principal}}</td><td>{{group .Cap}}</td><td>{{len .DaysOver}} ({{join .DaysOver}})</td><td>{{group .TokensAboveCap}}</td><td>{{group .MaxDay}}</td><td>{{w429 .}}</td></tr>
{{end}}</table>
{{end}}{{if .Overridden}}<h3>Override principals, each against its own cap</h3>
<table class="overrides">
<tr><th>principal</th><th>own cap</th><th>days</th><th>max</th><th>over cap</th><th>above cap</th><th>would-be 429s</th><th>denied</th><th>suggested cap</th></tr>
{{range .Overridden}}<tr><td>{{.Principal}}</td><td>{{cap .Cap}}</td><td>{{.DaysCovered}}/{{$.Days}}</td><td>{{group .Summary.Max}}</td><td>{{.Summary.OverCap}}</td><td>{{group .Summary.TokensAboveCap}}</td><td>{{.Summary.Would429}}</td><td>{{.Summary.Denied}}</td><td>{{sugg .SuggestedCap .NoData}}</td></tr>
{{end}}</table>
{{end}}</section>
{{end}}</body>
</html>
`))

// WriteHTML writes a self-contained HTML page with, per budget, a histogram
// of principal-day usage and vertical lines at the cap and the suggested cap.
func WriteHTML(w io.Writer, r *Report) error {
	p := htmlPage{Report: r}
	for _, b := range r.Budgets {
		p.Items = append(p.Items, htmlBudget{Budget: b, Chart: chart(b)})
	}
	return page.Execute(w, p)
}

func chart(b Budget) *htmlChart {
	if len(b.Distribution) == 0 {
		return nil
	}
	c := &htmlChart{PlotLeft: chartLeft, PlotRight: chartW - chartRight, PlotTop: chartTop, PlotBottom: chartH - chartBottom}
	xmax := max(b.Distribution[len(b.Distribution)-1], b.Cap, b.SuggestedCap)
	xmax += xmax / 20
	if xmax == 0 {
		xmax = 1
	}
	var counts [chartBins]int
	for _, v := range b.Distribution {
		i := int(float64(v) / float64(xmax) * chartBins)
		counts[min(i, chartBins-1)]++
	}
	for _, n := range counts {
		c.YMax = max(c.YMax, n)
	}
	plotW, plotH := c.PlotRight-c.PlotLeft, c.PlotBottom-c.PlotTop
	x := func(v uint64) float64 { return c.PlotLeft + float64(v)/float64(xmax)*plotW }
	binW := plotW / chartBins
	binSpan := float64(xmax) / chartBins
	for i, n := range counts {
		if n == 0 {
			continue
		}
		h := max(float64(n)/float64(c.YMax)*plotH, 1) // a single runaway stays visible
		c.Bars = append(c.Bars, htmlBar{
			X: c.PlotLeft + float64(i)*binW + 1, Y: c.PlotBottom - h, W: binW - 2, H: h,
			Title: fmt.Sprintf("%d principal-days between %s and %s tokens", n, group(uint64(float64(i)*binSpan)), group(uint64(float64(i+1)*binSpan))),
		})
	}
	for i := 0; i <= 4; i++ {
		v := xmax / 4 * uint64(i)
		c.XTicks = append(c.XTicks, htmlLine{X: x(v), Label: short(v)})
	}
	if b.Cap > 0 {
		c.Cap = &htmlLine{X: x(b.Cap), Label: "cap " + group(b.Cap)}
	}
	if b.SuggestedCap > 0 {
		c.Suggested = &htmlLine{X: x(b.SuggestedCap), Label: "suggested " + group(b.SuggestedCap)}
	}
	return c
}

// short writes 5300000 as 5.3M for axis ticks.
func short(v uint64) string {
	switch {
	case v >= 1_000_000_000:
		return fmt.Sprintf("%.1fG", float64(v)/1e9)
	case v >= 1_000_000:
		return fmt.Sprintf("%.1fM", float64(v)/1e6)
	case v >= 1_000:
		return fmt.Sprintf("%.1fk", float64(v)/1e3)
	}
	return fmt.Sprintf("%d", v)
}
