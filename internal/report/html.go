package report

import (
	"fmt"
	"html/template"
	"io"
	"strings"
)

// The HTML report is one self-contained file: inline CSS and inline SVG, no
// script, no external asset, so it can be attached to a ticket or served from
// anywhere. It reads top down as a decision: the summary table (one row per
// cap with its verdict), then per budget its days and, per cap, the
// distribution with the cap and the suggestion, the outliers apart, and the
// principals over.

type htmlCap struct {
	*Cap
	Chart *htmlChart
	// Reserve is the budget's reserve (Budget.Reserve).
	Reserve string
}

type htmlBudget struct {
	*Budget
	DayChart *htmlChart
	Caps     []htmlCap
	Money    bool
}

type htmlPage struct {
	*Report
	Items []htmlBudget
}

var funcs = template.FuncMap{
	"group":   group,
	"pct":     pct,
	"f":       func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"w":       func() float64 { return chartW },
	"win":     windowText,
	"tickEnd": func(y float64) float64 { return y + 4 },
	"dtext":   daysText,
	"date":    dateText,
	"w429":    would429Text,
	"join":    func(s []string) string { return strings.Join(s, ", ") },
	"top":     topText,
	"verdict": verdictText,
	"vclass":  func(v Verdict) string { return "v-" + v.Status },
	"dash":    orDash,
	"proj":    projMark,
	"money":   func(v uint64, cur string) string { return amountText(v, MeasureCost, cur) },
	"sugg":    func(c *Cap, v uint64, noData string) string { return suggestionText(c, v, noData) },
}

const htmlStyle = `body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:2px 8px;text-align:right;vertical-align:top}
th:first-child,td:first-child{text-align:left}
table.summary td.verdict,table.summary td.text,table.summary th:last-child{text-align:left}
table.summary td:first-child{white-space:nowrap}
td.v-ready{background:#e3f4e8;color:#1e6b34;font-weight:bold}
td.v-not-yet{background:#fdf0dc;color:#8a4b00}
td.v-enforced{background:#eee;color:#555}
p.v-ready{color:#1e6b34;font-weight:bold}
p.v-not-yet{color:#8a4b00}
svg.chart{background:#fafafa;border:1px solid #ddd;display:block;margin:.5em 0}
.bar{fill:#4a7bd0}
.daybar{fill:#7d5ba6}
.cap{stroke:#c0392b;stroke-width:2}
.suggested{stroke:#27ae60;stroke-width:2;stroke-dasharray:6 4}
.axis{stroke:#888}
text{font-size:11px;fill:#444}
.tick{stroke:#e4e4e4}
.title{fill:#222}
.caplabel,.overlabel{fill:#c0392b}
.suggestedlabel{fill:#1e8449}
.warn{color:#a15c00}
tr.partial td{font-style:italic;color:#666}
.nodata{font-weight:bold}
section.budget{border-top:2px solid #ddd;margin-top:2em}
`

const htmlChartTmpl = `{{define "chart"}}<svg class="chart" data-chart="{{.Kind}}"{{if .C.Log}} data-scale="log"{{end}} xmlns="http://www.w3.org/2000/svg" width="{{f w}}" height="{{f .C.Height}}" viewBox="0 0 {{f w}} {{f .C.Height}}" role="img" aria-label="{{.Label}}">
<title>{{.Label}}</title>
{{range .C.YTicks}}<line class="tick" x1="{{f $.C.PlotLeft}}" y1="{{f .Y}}" x2="{{f $.C.PlotRight}}" y2="{{f .Y}}"/>
<text class="label" x="{{f .X}}" y="{{f .Y}}" dy="4" text-anchor="{{.Anchor}}">{{.Text}}</text>
{{end}}{{range .C.Bars}}<rect class="{{$.BarClass}}" x="{{f .X}}" y="{{f .Y}}" width="{{f .W}}" height="{{f .H}}"><title>{{.Title}}</title></rect>
{{end}}<line class="axis" x1="{{f .C.PlotLeft}}" y1="{{f .C.PlotBottom}}" x2="{{f .C.PlotRight}}" y2="{{f .C.PlotBottom}}"/>
<line class="axis" x1="{{f .C.PlotLeft}}" y1="{{f .C.PlotTop}}" x2="{{f .C.PlotLeft}}" y2="{{f .C.PlotBottom}}"/>
{{range .C.XTicks}}<line class="axis" x1="{{f .X}}" y1="{{f $.C.PlotBottom}}" x2="{{f .X}}" y2="{{f (tickEnd $.C.PlotBottom)}}"/>
<text class="label" x="{{f .X}}" y="{{f .Y}}" text-anchor="{{.Anchor}}">{{.Text}}</text>
{{end}}{{range .C.Marks}}<text class="label overlabel" x="{{f .X}}" y="{{f .Y}}" text-anchor="{{.Anchor}}">{{.Text}}</text>
{{end}}{{with .C.XTitle}}<text class="label title" x="{{f .X}}" y="{{f .Y}}" text-anchor="{{.Anchor}}">{{.Text}}</text>
{{end}}{{with .C.YTitle}}<text class="label title" x="{{f .X}}" y="{{f .Y}}" text-anchor="{{.Anchor}}" transform="rotate(-90 {{f .X}} {{f .Y}})">{{.Text}}</text>
{{end}}{{with .C.Cap}}<line class="cap" x1="{{f .X}}" y1="{{f $.C.PlotTop}}" x2="{{f .X}}" y2="{{f $.C.PlotBottom}}"><title>{{.Label}}</title></line>
{{end}}{{with .C.CapLabel}}<text class="label caplabel" x="{{f .X}}" y="{{f .Y}}" text-anchor="{{.Anchor}}">{{.Text}}</text>
{{end}}{{with .C.Suggested}}<line class="suggested" x1="{{f .X}}" y1="{{f $.C.PlotTop}}" x2="{{f .X}}" y2="{{f $.C.PlotBottom}}"><title>{{.Label}}</title></line>
{{end}}{{with .C.SuggestedLabel}}<text class="label suggestedlabel" x="{{f .X}}" y="{{f .Y}}" text-anchor="{{.Anchor}}">{{.Text}}</text>
{{end}}</svg>
{{end}}`

const htmlCapTmpl = `{{define "cap"}}<h3>Cap {{.CapText}} {{.LabelText}}</h3>
<p>Judged on {{.Judged.Text}}. <span class="{{vclass .Verdict}}">{{verdict .Verdict}}</span>{{range .Verdict.Reasons}}; {{.}}{{end}}{{range .Verdict.Notes}}. Note: {{.}}{{end}}.</p>
{{if .NoData}}<p class="nodata">{{.NoData}}.</p>
{{else}}<p>{{.Summary.Principals}} principals, {{.Summary.PrincipalWindows}} principal-{{.Window}}s, total {{.Amount .Summary.Total}}.
Over the cap: {{.Summary.OverCap}} principal-{{.Window}}s ({{pct .Summary.LimitedShare}}), {{.Amount .Summary.AboveCap}} above it, {{.Summary.Would429}} would-be 429s, {{.Summary.Denied}} denied{{if .Summary.ReserveDenied}} ({{.Summary.ReserveDenied}} by reservations){{end}}.
Suggested cap: <strong>{{.Amount .SuggestedCap}}</strong> ({{.SuggestionBasis}}).</p>
{{with .Reservations .Summary}}<p class="reservations">{{.}}.</p>
{{end}}{{end}}{{with .Chart}}{{template "chart" (chartArgs . "histogram" "bar" "distribution of usage per principal and window against the cap")}}{{end}}{{if .Outliers}}<h4>Outliers, left out of the histogram</h4>
<table class="outliers">
<tr><th>principal</th><th>{{.Window}}</th><th>usage</th><th>x cap</th></tr>
{{range .Outliers}}<tr><td>{{.Principal}}</td><td>{{.Window}}</td><td>{{$.Amount .Value}}</td><td>{{times .Value .Cap}}</td></tr>
{{end}}</table>
{{end}}{{if not .NoData}}{{if .PerDay}}<table class="windows">
<tr><th>day</th><th>principal-hours</th><th>max hour</th><th>hours over</th><th>above cap</th><th>would-be 429s</th><th>denied</th>{{template "resh" $}}</tr>
{{range .PerDay}}<tr{{if .Partial}} class="partial"{{end}}><td>{{date .Window .Partial}}</td><td>{{.PrincipalWindows}}</td><td>{{$.Amount .Max}}</td><td>{{.OverCap}}</td><td>{{$.Amount .AboveCap}}</td><td>{{.Would429}}</td><td>{{.Denied}}</td>{{template "resd" (resArgs $ .Stats)}}</tr>
{{end}}</table>
{{else}}<table class="windows">
<tr><th>{{.Window}}</th><th>principals</th><th>p50</th><th>p95</th><th>p99</th><th>max</th><th>over cap</th><th>above cap</th><th>would-be 429s</th><th>denied</th>{{template "resh" $}}</tr>
{{range .PerWindow}}<tr{{if .Partial}} class="partial"{{end}}><td>{{date .Window .Partial}}</td><td>{{.Principals}}</td><td>{{$.Amount .P50}}</td><td>{{$.Amount .P95}}</td><td>{{$.Amount .P99}}</td><td>{{$.Amount .Max}}</td><td>{{.OverCap}}</td><td>{{$.Amount .AboveCap}}</td><td>{{.Would429}}</td><td>{{.Denied}}</td>{{template "resd" (resArgs $ .Stats)}}</tr>
{{end}}</table>
{{end}}{{end}}{{if .OverCapPrincipalsTotal}}<h4>Principals over the cap ({{top (len .OverCapPrincipals) .OverCapPrincipalsTotal}})</h4>
<table class="over">
<tr><th>principal</th><th>cap</th><th>{{.Window}}s over</th><th>above cap</th><th>max {{.Window}}</th><th>would-be 429s</th></tr>
{{range .OverCapPrincipals}}<tr><td>{{.Principal}}</td><td>{{$.Amount .Cap}}</td><td>{{len .WindowsOver}} ({{join .WindowsOver}})</td><td>{{$.Amount .AboveCap}}</td><td>{{$.Amount .MaxWindow}}</td><td>{{w429 .}}</td></tr>
{{end}}</table>
{{end}}{{if .Overridden}}<h4>Override principals, each against its own cap</h4>
<table class="overrides">
<tr><th>principal</th><th>own cap</th><th>{{.Window}}s</th><th>max</th><th>over cap</th><th>above cap</th><th>would-be 429s</th><th>denied</th><th>suggested cap</th>{{template "resh" $}}</tr>
{{range .Overridden}}<tr><td>{{.Principal}}</td><td>{{$.Amount .Cap}}</td><td>{{.WindowsCovered}}</td><td>{{$.Amount .Summary.Max}}</td><td>{{.Summary.OverCap}}</td><td>{{$.Amount .Summary.AboveCap}}</td><td>{{.Summary.Would429}}</td><td>{{.Summary.Denied}}</td><td>{{sugg $.Cap .SuggestedCap .NoData}}</td>{{template "resd" (resArgs $ .Summary)}}</tr>
{{end}}</table>
{{end}}{{end}}`

// htmlResTmpl are the reservation columns of a cap's tables: "resh" the
// headers (given the htmlCap), "resd" a row's cells (given resArgs).
const htmlResTmpl = `{{define "resh"}}{{if .Reserving}}<th>holds</th><th>held</th><th>expired</th><th>by reservations</th>{{end}}{{end}}{{define "resd"}}{{if .C.Reserving}}<td>{{group .S.Holds}}</td><td>{{.C.Amount .S.Held}}</td><td>{{.C.Amount .S.Expired}}</td><td>{{.S.ReserveDenied}}</td>{{end}}{{end}}`

const htmlPageTmpl = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>budgetgen report {{win .Report}}</title>
<style>
{{style}}</style>
</head>
<body>
<h1>Budgets: shadow measurements {{win .Report}}</h1>
<p>{{dtext .Report}} ({{.TimeZone}}), generated {{.GeneratedAt.Format "2006-01-02T15:04:05Z"}}. A cap is ready to promote after {{.RequiredDays}} full days of measurement with under {{pct .MaxLimitedShare}} of principal-windows over it; suggested caps keep at most {{pct .TargetLimitedShare}} over, a cap based on a peak adds a headroom of x{{printf "%.2f" .Headroom}}.</p>
{{with .NoData}}<p class="nodata">{{.}}</p>
{{end}}{{if .Summary}}<table class="summary">
<tr><th>budget</th><th>window</th><th>cap</th><th>mode</th><th>principals over</th><th>would-be 429s</th><th>suggested cap</th><th>verdict</th></tr>
{{range .Summary}}<tr><td><a href="#budget-{{.Budget}}">{{.Budget}}</a></td><td class="text">{{.Window}}{{proj .Projection}}</td><td>{{.CapText}}</td><td class="text">{{dash .Mode}}</td><td>{{.PrincipalsOver}}</td><td>{{.Would429}}</td><td>{{.SuggestedText}}</td><td class="verdict {{vclass .Verdict}}">{{verdict .Verdict}}{{range .Verdict.Reasons}}<br>{{.}}{{end}}</td></tr>
{{end}}</table>
{{end}}{{range .Warnings}}<p class="warn">warning: {{.}}</p>
{{end}}{{range $it := .Items}}<section class="budget" id="budget-{{.Name}}">
<h2>{{.Name}}{{if .Mode}} ({{.Mode}}){{end}}</h2>
<p class="{{vclass .Verdict}}">{{verdict .Verdict}}{{range .Verdict.Reasons}}; {{.}}{{end}}</p>
{{with .NoData}}<p class="nodata">{{.}}</p>
{{end}}{{with .DayChart}}{{template "chart" (chartArgs . "days" "daybar" "usage per day")}}{{end}}{{if .Daily}}<table class="daily">
<tr><th>day</th><th>tokens</th>{{if .Money}}<th>money</th>{{end}}<th>largest principal</th><th>principals over a cap</th><th>would-be 429s</th></tr>
{{range .Daily}}<tr{{if .Partial}} class="partial"{{end}}><td>{{date .Date .Partial}}</td><td>{{group .Tokens}}</td>{{if $it.Money}}<td>{{if .Currency}}{{money .Money .Currency}}{{end}}</td>{{end}}<td>{{group .MaxPrincipal}}</td><td>{{.PrincipalsOver}}</td><td>{{.Would429}}</td></tr>
{{end}}</table>
{{end}}{{range .Caps}}{{template "cap" .}}{{end}}</section>
{{end}}</body>
</html>
`

// chartData is what the chart template draws.
type chartData struct {
	C                     *htmlChart
	Kind, BarClass, Label string
}

var page = template.Must(template.New("report").Funcs(funcs).Funcs(template.FuncMap{
	"style":     func() template.CSS { return template.CSS(htmlStyle) },
	"chartArgs": func(c *htmlChart, kind, bar, label string) chartData { return chartData{c, kind, bar, label} },
	"resArgs":   func(c htmlCap, s Stats) resData { return resData{c, s} },
	"times": func(v, c uint64) string {
		if c == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", float64(v)/float64(c))
	},
}).Parse(htmlPageTmpl + htmlChartTmpl + htmlCapTmpl + htmlResTmpl))

// resData is what a row's reservation cells show.
type resData struct {
	C htmlCap
	S Stats
}

// CapText, LabelText and Amount let the template format a cap's amounts.
func (c htmlCap) CapText() string        { return c.capOf() }
func (c htmlCap) LabelText() string      { return c.label() }
func (c htmlCap) Amount(v uint64) string { return c.amount(v) }

// Reserving and Reservations say what the cap shows of its budget's
// reservations.
func (c htmlCap) Reserving() bool { return c.reserving(c.Reserve) }
func (c htmlCap) Reservations(s Stats) string {
	return capitalize(c.reservationText(s, c.Reserve))
}

// CapText and SuggestedText format a summary row's amounts.
func (s SummaryRow) CapText() string       { return s.capText() }
func (s SummaryRow) SuggestedText() string { return s.suggestedText() }

// WriteHTML writes a self-contained HTML page: the summary table, then per
// budget a chart and table of its days and, per cap, a histogram of
// principal-window usage with lines at the cap and the suggestion, the
// outliers apart, and the principals over.
func WriteHTML(w io.Writer, r *Report) error {
	p := htmlPage{Report: r}
	for i := range r.Budgets {
		b := &r.Budgets[i]
		hb := htmlBudget{Budget: b, DayChart: dayChart(b)}
		for _, d := range b.Daily {
			hb.Money = hb.Money || d.Currency != ""
		}
		for j := range b.Caps {
			hb.Caps = append(hb.Caps, htmlCap{Cap: &b.Caps[j], Chart: histogram(&b.Caps[j]), Reserve: b.Reserve})
		}
		p.Items = append(p.Items, hb)
	}
	return page.Execute(w, p)
}
