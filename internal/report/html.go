package report

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
)

// The HTML report is one self-contained file: inline CSS and one inline SVG
// per budget, no script, no external asset, so it can be attached to a ticket
// or served from anywhere.

// Chart geometry, in SVG user units (the viewBox). Labels use an 11px font;
// labelCharW over-estimates its average glyph width so that the boxes the
// layout reserves (and the test checks) contain the drawn text.
const (
	chartW, chartH = 720.0, 320.0
	plotLeft       = 78.0 // y tick labels and the rotated y title
	plotRight      = 28.0 // room for the last x tick label
	plotTop        = 44.0 // two rows of line labels (cap, suggestion)
	plotBottom     = 58.0 // x tick labels and the x title
	labelRow1      = 16.0 // baseline of the cap label
	labelRow2      = 32.0 // baseline of the suggestion label
	labelFont      = 11.0
	xTickDY        = 22.0 // x tick label baseline below the axis: clear of the y axis "0"
	labelCharW     = 7.0
	chartBins      = 24
	// logRatio: a principal whose peak is this many times the next one's
	// switches the x axis to a log scale, or everyone else is one bar.
	logRatio = 10
)

type htmlBar struct {
	X, Y, W, H float64
	Title      string
}

type htmlLine struct {
	X     float64
	Label string
}

// htmlLabel is a text element with its anchor.
type htmlLabel struct {
	X, Y   float64
	Anchor string // start, middle or end
	Text   string
}

type htmlChart struct {
	Bars                                     []htmlBar
	Cap, Suggested                           *htmlLine
	CapLabel                                 *htmlLabel
	SuggestedLabel                           *htmlLabel
	XTicks, YTicks                           []htmlLabel
	XTitle, YTitle                           htmlLabel
	Log                                      bool
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
	"group":   group,
	"pct":     pct,
	"cap":     capText,
	"f":       func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"w":       func() float64 { return chartW },
	"win":     windowText,
	"tickEnd": func(y float64) float64 { return y + 4 },
	"dtext":   daysText,
	"day":     dayText,
	"w429":    would429Text,
	"sugg":    suggestionText,
	"join":    func(s []string) string { return strings.Join(s, ", ") },
	"top":     topText,
	"h":       func() float64 { return chartH },
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
.tick{stroke:#e4e4e4}
.title{fill:#222}
.caplabel{fill:#c0392b}
.suggestedlabel{fill:#1e8449}
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
{{end}}{{with .Chart}}<svg class="chart" data-budget="{{$it.Name}}"{{if .Log}} data-scale="log"{{end}} xmlns="http://www.w3.org/2000/svg" width="{{f w}}" height="{{f h}}" viewBox="0 0 {{f w}} {{f h}}" role="img" aria-label="distribution of daily usage per principal against the cap">
<title>Principal-days by daily usage, against the cap</title>
{{range .YTicks}}<line class="tick" x1="{{f $it.Chart.PlotLeft}}" y1="{{f .Y}}" x2="{{f $it.Chart.PlotRight}}" y2="{{f .Y}}"/>
<text class="label" x="{{f .X}}" y="{{f .Y}}" dy="4" text-anchor="{{.Anchor}}">{{.Text}}</text>
{{end}}{{range .Bars}}<rect class="bar" x="{{f .X}}" y="{{f .Y}}" width="{{f .W}}" height="{{f .H}}"><title>{{.Title}}</title></rect>
{{end}}<line class="axis" x1="{{f .PlotLeft}}" y1="{{f .PlotBottom}}" x2="{{f .PlotRight}}" y2="{{f .PlotBottom}}"/>
<line class="axis" x1="{{f .PlotLeft}}" y1="{{f .PlotTop}}" x2="{{f .PlotLeft}}" y2="{{f .PlotBottom}}"/>
{{range .XTicks}}<line class="axis" x1="{{f .X}}" y1="{{f $it.Chart.PlotBottom}}" x2="{{f .X}}" y2="{{f (tickEnd $it.Chart.PlotBottom)}}"/>
<text class="label" x="{{f .X}}" y="{{f .Y}}" text-anchor="{{.Anchor}}">{{.Text}}</text>
{{end}}{{with .XTitle}}<text class="label title" x="{{f .X}}" y="{{f .Y}}" text-anchor="{{.Anchor}}">{{.Text}}</text>
{{end}}{{with .YTitle}}<text class="label title" x="{{f .X}}" y="{{f .Y}}" text-anchor="{{.Anchor}}" transform="rotate(-90 {{f .X}} {{f .Y}})">{{.Text}}</text>
{{end}}{{with .Cap}}<line class="cap" x1="{{f .X}}" y1="{{f $it.Chart.PlotTop}}" x2="{{f .X}}" y2="{{f $it.Chart.PlotBottom}}"><title>{{.Label}}</title></line>
{{end}}{{with .CapLabel}}<text class="label caplabel" x="{{f .X}}" y="{{f .Y}}" text-anchor="{{.Anchor}}">{{.Text}}</text>
{{end}}{{with .Suggested}}<line class="suggested" x1="{{f .X}}" y1="{{f $it.Chart.PlotTop}}" x2="{{f .X}}" y2="{{f $it.Chart.PlotBottom}}"><title>{{.Label}}</title></line>
{{end}}{{with .SuggestedLabel}}<text class="label suggestedlabel" x="{{f .X}}" y="{{f .Y}}" text-anchor="{{.Anchor}}">{{.Text}}</text>
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
	c := &htmlChart{PlotLeft: plotLeft, PlotRight: chartW - plotRight, PlotTop: plotTop, PlotBottom: chartH - plotBottom}
	plotW, plotH := c.PlotRight-c.PlotLeft, c.PlotBottom-c.PlotTop
	peak := b.Distribution[len(b.Distribution)-1]
	hi := max(peak, b.Cap, b.SuggestedCap)
	c.Log = needsLog(b.PrincipalPeaks)
	var scale axisScale
	if c.Log {
		scale = newLogScale(b.Distribution, hi)
	} else {
		scale = newLinearScale(hi)
	}
	x := func(v uint64) float64 { return c.PlotLeft + scale.pos(v)*plotW }

	var counts [chartBins]int
	for _, v := range b.Distribution {
		i := int(scale.pos(v) * chartBins)
		counts[min(max(i, 0), chartBins-1)]++
	}
	ymax := 0
	for _, n := range counts {
		ymax = max(ymax, n)
	}
	ystep := niceStep(uint64(ymax), 5)
	ytop := (uint64(ymax) + ystep - 1) / ystep * ystep
	for v := uint64(0); v <= ytop; v += ystep {
		y := c.PlotBottom - float64(v)/float64(ytop)*plotH
		c.YTicks = append(c.YTicks, htmlLabel{X: c.PlotLeft - 6, Y: y, Anchor: "end", Text: group(v)})
	}
	binW := plotW / chartBins
	for i, n := range counts {
		if n == 0 {
			continue
		}
		h := max(float64(n)/float64(ytop)*plotH, 1) // a single runaway stays visible
		lo, up := scale.value(float64(i)/chartBins), scale.value(float64(i+1)/chartBins)
		c.Bars = append(c.Bars, htmlBar{
			X: c.PlotLeft + float64(i)*binW + 1, Y: c.PlotBottom - h, W: binW - 2, H: h,
			Title: fmt.Sprintf("%d principal-days between %s and %s tokens", n, group(lo), group(up)),
		})
	}
	for _, v := range scale.ticks() {
		c.XTicks = append(c.XTicks, htmlLabel{X: x(v), Y: c.PlotBottom + xTickDY, Anchor: "middle", Text: short(v)})
	}
	if n := len(c.XTicks); n > 0 {
		last := &c.XTicks[n-1]
		if last.X+labelWidth(last.Text)/2 > chartW-2 {
			last.Anchor = "end"
		}
	}
	xt := "tokens per principal-day"
	if c.Log {
		xt += " (log scale: one principal is over 10x the rest)"
	}
	c.XTitle = htmlLabel{X: c.PlotLeft + plotW/2, Y: chartH - 12, Anchor: "middle", Text: xt}
	c.YTitle = htmlLabel{X: 18, Y: c.PlotTop + plotH/2, Anchor: "middle", Text: "principal-days (count)"}
	// The cap's label is on the first row above the plot, the suggestion's
	// on the second: they never overlap, however close the lines are.
	if b.Cap > 0 {
		c.Cap = &htmlLine{X: x(b.Cap), Label: "cap " + group(b.Cap)}
		c.CapLabel = lineLabel(c.Cap, labelRow1)
	}
	if b.SuggestedCap > 0 {
		c.Suggested = &htmlLine{X: x(b.SuggestedCap), Label: "suggested " + group(b.SuggestedCap)}
		c.SuggestedLabel = lineLabel(c.Suggested, labelRow2)
	}
	return c
}

// lineLabel places a line's label right of it, or left when it would leave
// the chart.
func lineLabel(l *htmlLine, y float64) *htmlLabel {
	lb := &htmlLabel{X: l.X + 4, Y: y, Anchor: "start", Text: l.Label}
	if lb.X+labelWidth(l.Label) > chartW-2 {
		lb.X, lb.Anchor = l.X-4, "end"
	}
	if lb.Anchor == "end" && lb.X-labelWidth(l.Label) < 2 {
		lb.X, lb.Anchor = 2, "start"
	}
	return lb
}

func labelWidth(s string) float64 { return float64(len([]rune(s))) * labelCharW }

// needsLog: the largest principal peak is over logRatio times the next.
func needsLog(peaks []uint64) bool {
	n := len(peaks)
	return n >= 2 && peaks[n-2] > 0 && peaks[n-1] > logRatio*peaks[n-2]
}

// axisScale maps a token count to [0, 1] along the x axis and back.
type axisScale interface {
	pos(v uint64) float64
	value(p float64) uint64
	ticks() []uint64
}

type linearScale struct{ top, step uint64 }

func newLinearScale(hi uint64) linearScale {
	hi += hi / 20 // the largest value is not on the edge
	step := niceStep(max(hi, 1), 5)
	return linearScale{top: (max(hi, 1) + step - 1) / step * step, step: step}
}

func (s linearScale) pos(v uint64) float64   { return float64(v) / float64(s.top) }
func (s linearScale) value(p float64) uint64 { return uint64(p * float64(s.top)) }
func (s linearScale) ticks() []uint64 {
	var out []uint64
	for v := uint64(0); v <= s.top; v += s.step {
		out = append(out, v)
	}
	return out
}

// logScale spans whole decades from below the smallest positive value to
// above hi; zero sits at the left edge.
type logScale struct{ lo, hi float64 } // log10 bounds

func newLogScale(values []uint64, hi uint64) logScale {
	minPos := hi
	for _, v := range values {
		if v > 0 {
			minPos = min(minPos, v)
			break // sorted
		}
	}
	lo := math.Floor(math.Log10(float64(max(minPos, 1))))
	up := math.Ceil(math.Log10(float64(max(hi, 1)) * 1.05))
	if up <= lo {
		up = lo + 1
	}
	return logScale{lo: lo, hi: up}
}

func (s logScale) pos(v uint64) float64 {
	if v == 0 {
		return 0
	}
	return min(max((math.Log10(float64(v))-s.lo)/(s.hi-s.lo), 0), 1)
}
func (s logScale) value(p float64) uint64 {
	return uint64(math.Round(math.Pow(10, s.lo+p*(s.hi-s.lo))))
}
func (s logScale) ticks() []uint64 {
	var out []uint64
	for e := s.lo; e <= s.hi; e++ {
		out = append(out, uint64(math.Round(math.Pow(10, e))))
	}
	return out
}

// niceStep is the smallest 1, 2 or 5 x 10^k step that cuts [0, v] into at
// most n steps.
func niceStep(v uint64, n uint64) uint64 {
	if v == 0 {
		return 1
	}
	for unit := uint64(1); ; unit *= 10 {
		for _, m := range []uint64{1, 2, 5} {
			if step := m * unit; (v+step-1)/step <= n {
				return step
			}
		}
	}
}

// short writes 5300000 as 5.3M and 5000000 as 5M for axis ticks.
func short(v uint64) string {
	f := func(x float64, unit string) string {
		return strings.TrimSuffix(fmt.Sprintf("%.1f", x), ".0") + unit
	}
	switch {
	case v >= 1_000_000_000:
		return f(float64(v)/1e9, "G")
	case v >= 1_000_000:
		return f(float64(v)/1e6, "M")
	case v >= 1_000:
		return f(float64(v)/1e3, "k")
	}
	return fmt.Sprintf("%d", v)
}
