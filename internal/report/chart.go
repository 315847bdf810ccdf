package report

import (
	"fmt"
	"math"
	"strings"
)

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
	// Marks are labels over bars (principals over the cap on a day).
	Marks []htmlLabel
	// Height is the viewBox height.
	Height float64
}

// unitName is what a cap's amounts count: tokens, or its currency.
func unitName(c *Cap) string {
	if c.Measure == MeasureCost {
		return c.Currency
	}
	return "tokens"
}

// histogram draws the distribution of a cap's principal-windows (outliers
// left out: they are listed apart) with lines at the cap and the suggestion.
func histogram(cp *Cap) *htmlChart {
	if len(cp.Distribution) == 0 {
		return nil
	}
	c := &htmlChart{PlotLeft: plotLeft, PlotRight: chartW - plotRight, PlotTop: plotTop, PlotBottom: chartH - plotBottom, Height: chartH}
	plotW, plotH := c.PlotRight-c.PlotLeft, c.PlotBottom-c.PlotTop
	peak := cp.Distribution[len(cp.Distribution)-1]
	hi := max(peak, cp.Cap, cp.SuggestedCap)
	c.Log = cp.OutliersTotal == 0 && needsLog(cp.PrincipalPeaks)
	var scale axisScale = newLinearScale(hi)
	if c.Log {
		scale = newLogScale(cp.Distribution, hi)
	}
	x := func(v uint64) float64 { return c.PlotLeft + scale.pos(v)*plotW }
	var counts [chartBins]int
	for _, v := range cp.Distribution {
		i := int(scale.pos(v) * chartBins)
		counts[min(max(i, 0), chartBins-1)]++
	}
	ymax := 0
	for _, n := range counts {
		ymax = max(ymax, n)
	}
	ytop := c.yTicks(uint64(ymax), plotH, group)
	binW := plotW / chartBins
	for i, n := range counts {
		if n == 0 {
			continue
		}
		h := max(float64(n)/float64(ytop)*plotH, 1) // a single principal stays visible
		lo, up := scale.value(float64(i)/chartBins), scale.value(float64(i+1)/chartBins)
		c.Bars = append(c.Bars, htmlBar{
			X: c.PlotLeft + float64(i)*binW + 1, Y: c.PlotBottom - h, W: binW - 2, H: h,
			Title: fmt.Sprintf("%d principal-%ss between %s and %s", n, cp.Window, cp.amount(lo), cp.amount(up)),
		})
	}
	for _, v := range scale.ticks() {
		c.XTicks = append(c.XTicks, htmlLabel{X: x(v), Y: c.PlotBottom + xTickDY, Anchor: "middle", Text: cp.short(v)})
	}
	c.fitLastTick()
	xt := unitName(cp) + " per principal-" + cp.Window
	switch {
	case cp.OutliersTotal > 0:
		xt += fmt.Sprintf(" (%d outliers listed apart)", cp.OutliersTotal)
	case c.Log:
		xt += " (log scale: one principal is over 10x the rest)"
	}
	c.XTitle = htmlLabel{X: c.PlotLeft + plotW/2, Y: chartH - 12, Anchor: "middle", Text: xt}
	c.YTitle = htmlLabel{X: 18, Y: c.PlotTop + plotH/2, Anchor: "middle", Text: "principal-" + cp.Window + "s (count)"}
	// The cap's label is on the first row above the plot, the suggestion's
	// on the second: they never overlap, however close the lines are.
	if cp.Cap > 0 {
		c.Cap = &htmlLine{X: x(cp.Cap), Label: "cap " + cp.amount(cp.Cap)}
		c.CapLabel = lineLabel(c.Cap, labelRow1)
	}
	if cp.SuggestedCap > 0 {
		c.Suggested = &htmlLine{X: x(cp.SuggestedCap), Label: "suggested " + cp.amount(cp.SuggestedCap)}
		c.SuggestedLabel = lineLabel(c.Suggested, labelRow2)
	}
	return c
}

// yTicks adds the y axis ticks for counts up to ymax and returns the top.
func (c *htmlChart) yTicks(ymax uint64, plotH float64, text func(uint64) string) uint64 {
	ystep := niceStep(ymax, 5)
	ytop := (max(ymax, 1) + ystep - 1) / ystep * ystep
	for v := uint64(0); v <= ytop; v += ystep {
		y := c.PlotBottom - float64(v)/float64(ytop)*plotH
		c.YTicks = append(c.YTicks, htmlLabel{X: c.PlotLeft - 6, Y: y, Anchor: "end", Text: text(v)})
	}
	return ytop
}

// fitLastTick keeps the last x tick label inside the chart.
func (c *htmlChart) fitLastTick() {
	if n := len(c.XTicks); n > 0 {
		last := &c.XTicks[n-1]
		if last.X+labelWidth(last.Text)/2 > chartW-2 {
			last.Anchor = "end"
		}
	}
}

// Day chart geometry: one bar per day of the report.
const (
	dayChartH   = 260.0
	dayMarkRow  = 30.0 // baseline of the "N over" marks, above the plot
	dayPlotTop  = 40.0
	dayTickEach = 36.0 // the least room per x tick label (MM-DD)
)

// dayChart draws a budget's tokens per day (money when it counts money
// only), each bar marked with the principals over a cap that day.
func dayChart(b *Budget) *htmlChart {
	if len(b.Daily) == 0 {
		return nil
	}
	money := true
	for _, d := range b.Daily {
		money = money && d.Tokens == 0 && d.Currency != ""
	}
	val := func(d DailyTotal) uint64 { return d.Tokens }
	unit, amount := "tokens", func(v uint64) string { return short(v) }
	if money {
		cur := b.Daily[0].Currency
		val, unit = func(d DailyTotal) uint64 { return d.Money }, cur
		amount = func(v uint64) string { return shortMoney(v) }
	}
	c := &htmlChart{PlotLeft: plotLeft, PlotRight: chartW - plotRight, PlotTop: dayPlotTop, PlotBottom: dayChartH - plotBottom, Height: dayChartH}
	plotW, plotH := c.PlotRight-c.PlotLeft, c.PlotBottom-c.PlotTop
	var top uint64
	for _, d := range b.Daily {
		top = max(top, val(d))
	}
	ytop := c.yTicks(top, plotH, amount)
	slot := plotW / float64(len(b.Daily))
	every := int(math.Ceil(dayTickEach / slot))
	for i, d := range b.Daily {
		h := float64(val(d)) / float64(ytop) * plotH
		if val(d) > 0 {
			h = max(h, 1)
		}
		x := c.PlotLeft + float64(i)*slot
		title := fmt.Sprintf("%s: %s tokens", dateText(d.Date, d.Partial), group(d.Tokens))
		if d.Currency != "" {
			title += ", " + amountText(d.Money, MeasureCost, d.Currency)
		}
		title += fmt.Sprintf("; largest principal %s, %d over a cap, %d would-be 429s", group(d.MaxPrincipal), d.PrincipalsOver, d.Would429)
		c.Bars = append(c.Bars, htmlBar{X: x + slot*0.15, Y: c.PlotBottom - h, W: slot * 0.7, H: h, Title: title})
		if i%every == 0 {
			c.XTicks = append(c.XTicks, htmlLabel{X: x + slot/2, Y: c.PlotBottom + xTickDY, Anchor: "middle", Text: strings.TrimPrefix(d.Date[5:], "0")})
		}
		if mark := fmt.Sprintf("%d over", d.PrincipalsOver); d.PrincipalsOver > 0 && labelWidth(mark) <= slot {
			c.Marks = append(c.Marks, htmlLabel{X: x + slot/2, Y: dayMarkRow, Anchor: "middle", Text: mark})
		}
	}
	c.fitLastTick()
	c.XTitle = htmlLabel{X: c.PlotLeft + plotW/2, Y: dayChartH - 12, Anchor: "middle", Text: unit + " per day, all principals (red: principals over a cap)"}
	c.YTitle = htmlLabel{X: 18, Y: c.PlotTop + plotH/2, Anchor: "middle", Text: unit}
	return c
}

// short writes an amount of a cap for an axis tick.
func (c *Cap) short(v uint64) string {
	if c.Measure == MeasureCost {
		return shortMoney(v)
	}
	return short(v)
}

// shortMoney writes 1/10,000 units as currency units: 12.5, 3k.
func shortMoney(v uint64) string {
	if v >= 10_000*1000 {
		return short(v / 10_000)
	}
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", float64(v)/10_000), "0"), ".")
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
