package report

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// chartCases are report shapes that stress the chart layout.
func chartCases() map[string]*Report {
	out := map[string]*Report{}
	mk := func(name string, capv uint64, usage func(i int) map[string]uint64) {
		m := Mapping{Rules: map[ledger.RuleID]RuleInfo{ruleRun: {Budget: name, Kind: budgetmap.KindTokens, Measure: MeasureTokens, Scale: 1}}, Budgets: map[string]BudgetInfo{name: {Mode: "shadow", Caps: dayCap(capv)}}}
		var data []ledger.Data
		for i := 0; i < 7; i++ {
			data = append(data, dd(ruleRun, ledger.DayOf(now)-ledger.Day(7-i), usage(i), ledger.Denials{Shadow: 3}, nil))
		}
		r, err := Build(data, m, Options{Now: now})
		if err != nil {
			panic(err)
		}
		out[name] = r
	}
	// 40 steady principals, cap well above them.
	mk("steady", 5_000_000, func(i int) map[string]uint64 {
		u := map[string]uint64{}
		for p := 0; p < 40; p++ {
			u[fmt.Sprintf("run-%d", p)] = uint64(200_000 + 50_000*p + 7_000*i)
		}
		return u
	})
	// One principal at 40x everyone else but under the cap: a log scale.
	mk("spread", 100_000_000, func(i int) map[string]uint64 {
		u := map[string]uint64{"runaway": 80_000_000}
		for p := 0; p < 30; p++ {
			u[fmt.Sprintf("run-%d", p)] = uint64(100_000 + 60_000*p)
		}
		return u
	})
	// Two runaways over the cap among 800 principals: outliers, listed
	// apart, do not squash the 800 into one bin.
	mk("runaways", 5_000_000, func(i int) map[string]uint64 {
		u := map[string]uint64{"runaway-1": 200_000_000, "runaway-2": 150_000_000 + uint64(i)}
		for p := 0; p < 800; p++ {
			u[fmt.Sprintf("run-%03d", p)] = uint64(500_000 + 5_000*p + 1_000*i)
		}
		// Ten heavy runs just over the cap: 1.5% of principal-days, not yet.
		for p := 0; p < 10; p++ {
			u[fmt.Sprintf("heavy-%d", p)] = uint64(5_100_000 + 40_000*p)
		}
		return u
	})
	// Cap and suggestion almost equal, both at the right edge.
	mk("close", 1_000_000, func(i int) map[string]uint64 {
		return map[string]uint64{"a": 990_000, "b": 400_000, "c": 700_000}
	})
	// Tiny numbers.
	mk("tiny", 10, func(i int) map[string]uint64 { return map[string]uint64{"a": 3, "b": uint64(i)} })
	return out
}

func renderHTML(t *testing.T, r *Report) string {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteHTML(&buf, r); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

type svgText struct {
	X, Y      float64
	Anchor    string
	Transform string
	Dy        float64
	Text      string
}

type box struct{ x0, y0, x1, y1 float64 }

func (b box) overlaps(o box) bool { return b.x0 < o.x1 && o.x0 < b.x1 && b.y0 < o.y1 && o.y0 < b.y1 }

// svgLabels parses the chart's text elements and returns the box each one
// needs (labelCharW per character, the font's ascent above the baseline).
func svgLabels(t *testing.T, svg string) (w, h float64, boxes []box, texts []svgText) {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(svg))
	var cur *svgText
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch e := tok.(type) {
		case xml.StartElement:
			attr := map[string]string{}
			for _, a := range e.Attr {
				attr[a.Name.Local] = a.Value
			}
			if e.Name.Local == "svg" {
				vb := strings.Fields(attr["viewBox"])
				w, _ = strconv.ParseFloat(vb[2], 64)
				h, _ = strconv.ParseFloat(vb[3], 64)
			}
			if e.Name.Local == "text" {
				x, _ := strconv.ParseFloat(attr["x"], 64)
				y, _ := strconv.ParseFloat(attr["y"], 64)
				dy, _ := strconv.ParseFloat(attr["dy"], 64)
				cur = &svgText{X: x, Y: y, Dy: dy, Anchor: attr["text-anchor"], Transform: attr["transform"]}
			}
		case xml.CharData:
			if cur != nil {
				cur.Text += string(e)
			}
		case xml.EndElement:
			if e.Name.Local == "text" && cur != nil {
				texts = append(texts, *cur)
				cur = nil
			}
		}
	}
	for _, tx := range texts {
		tw := labelWidth(tx.Text)
		var x0 float64
		switch tx.Anchor {
		case "middle":
			x0 = tx.X - tw/2
		case "end":
			x0 = tx.X - tw
		default:
			x0 = tx.X
		}
		base := tx.Y + tx.Dy
		b := box{x0, base - labelFont, x0 + tw, base + 3}
		if strings.HasPrefix(tx.Transform, "rotate(-90") {
			// Rotated about (X, Y): the run goes up the page.
			b = box{tx.X - labelFont, tx.Y - tw/2, tx.X + 3, tx.Y + tw/2}
		}
		boxes = append(boxes, b)
	}
	return w, h, boxes, texts
}

func TestChartGeometry(t *testing.T) {
	for name, r := range chartCases() {
		t.Run(name, func(t *testing.T) {
			h := renderHTML(t, r)
			for _, kind := range []string{"histogram", "days"} {
				svg := regexp.MustCompile(`(?s)<svg class="chart" data-chart="` + kind + `".*?</svg>`).FindString(h)
				if svg == "" {
					t.Fatalf("no %s chart", kind)
				}
				checkLabels(t, kind, svg)
			}
			svg := regexp.MustCompile(`(?s)<svg class="chart" data-chart="histogram".*?</svg>`).FindString(h)
			if log := strings.Contains(svg, `data-scale="log"`); log != (name == "spread") {
				t.Errorf("log scale %v for %s", log, name)
			}
			bins := strings.Count(svg, `<rect class="bar"`)
			if name == "runaways" {
				// The outliers are listed apart, and the 800 spread over the axis.
				if bins < 12 || !strings.Contains(h, "<h4>Outliers, left out of the histogram</h4>") || !strings.Contains(svg, "(14 outliers listed apart)") {
					t.Errorf("runaways: %d bins\n%s", bins, svg)
				}
			}
		})
	}
}

// checkLabels: every label of a chart is inside its viewBox and none
// overlaps another; both axes have ticks and titles.
func checkLabels(t *testing.T, kind, svg string) {
	t.Helper()
	w, ht, boxes, texts := svgLabels(t, svg)
	if w != chartW || len(texts) < 5 {
		t.Fatalf("%s: viewBox %vx%v, %d labels", kind, w, ht, len(texts))
	}
	var all []string
	for _, tx := range texts {
		all = append(all, tx.Text)
	}
	joined := strings.Join(all, "|")
	want := map[string][]string{"histogram": {"tokens per principal-day", "principal-days (count)", "cap ", "suggested "}, "days": {"tokens per day, all principals", "tokens"}}[kind]
	for _, s := range want {
		if !strings.Contains(joined, s) {
			t.Errorf("%s: no %q label in %q", kind, s, joined)
		}
	}
	var xTicks, yTicks int
	for _, tx := range texts {
		if tx.Anchor == "end" && tx.X < plotLeft {
			yTicks++
		}
		if tx.Y == ht-plotBottom+xTickDY {
			xTicks++
		}
	}
	if xTicks < 3 || yTicks < 2 {
		t.Errorf("%s: ticks: %d on x, %d on y", kind, xTicks, yTicks)
	}
	for i, b := range boxes {
		if b.x0 < 0 || b.y0 < 0 || b.x1 > w || b.y1 > ht {
			t.Errorf("%s: label %q at %+v leaves the viewBox %vx%v", kind, texts[i].Text, b, w, ht)
		}
		for j := i + 1; j < len(boxes); j++ {
			if b.overlaps(boxes[j]) {
				t.Errorf("%s: labels %q and %q overlap: %+v %+v", kind, texts[i].Text, texts[j].Text, b, boxes[j])
			}
		}
	}
}

// chromium finds a headless-capable Chromium. Under CI=true its absence is a
// failure: hack/install-deps.sh installs it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not found (hack/install-deps.sh installs it)")
	}
	t.Skip("chromium not installed; run hack/install-deps.sh")
	return ""
}

// Screenshot renders page at 1280 px wide in headless Chromium.
func screenshot(t *testing.T, browser, page, out string, height int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir="+t.TempDir(),
		"--hide-scrollbars", "--screenshot="+out, fmt.Sprintf("--window-size=1280,%d", height), "file://"+page)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, b)
	}
}

// TestChartScreenshot renders a report in a real browser and checks what a
// reader sees: the summary's verdict colours at the top, the day chart's
// bars, the histogram's bars and the cap line. BUDGETGEN_SCREENSHOT=FILE
// keeps the PNG; BUDGETGEN_SCREENSHOT_CASE picks another shape.
func TestChartScreenshot(t *testing.T) {
	browser := chromium(t)
	dir := t.TempDir()
	which := "runaways"
	if c := os.Getenv("BUDGETGEN_SCREENSHOT_CASE"); c != "" { // look at another case
		which = c
	}
	r := chartCases()[which]
	if r == nil {
		t.Fatalf("no case %q", which)
	}
	page := filepath.Join(dir, "report.html")
	if err := os.WriteFile(page, []byte(renderHTML(t, r)), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "report.png")
	screenshot(t, browser, page, out, 1400)
	if dst := os.Getenv("BUDGETGEN_SCREENSHOT"); dst != "" { // to look at it
		b, _ := os.ReadFile(out)
		_ = os.WriteFile(dst, b, 0o644)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if w := img.Bounds().Dx(); w != 1280 {
		t.Fatalf("screenshot %d px wide", w)
	}
	near := func(r, g, b uint32, c [3]int) bool {
		d := func(a uint32, c int) int { x := int(a>>8) - c; return max(x, -x) }
		return d(r, c[0]) < 24 && d(g, c[1]) < 24 && d(b, c[2]) < 24
	}
	colours := map[string][3]int{"bar": {0x4a, 0x7b, 0xd0}, "cap": {0xc0, 0x39, 0x2b}, "daybar": {0x7d, 0x5b, 0xa6}, "not-yet": {0xfd, 0xf0, 0xdc}}
	count, firstY := map[string]int{}, map[string]int{}
	distinct := map[[3]uint32]bool{}
	bnd := img.Bounds()
	for y := bnd.Min.Y; y < bnd.Max.Y; y++ {
		for x := bnd.Min.X; x < bnd.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			distinct[[3]uint32{r >> 8, g >> 8, b >> 8}] = true
			for name, c := range colours {
				if near(r, g, b, c) {
					if count[name] == 0 {
						firstY[name] = y
					}
					count[name]++
				}
			}
		}
	}
	if which != "runaways" {
		return
	}
	if count["bar"] < 2000 || count["cap"] < 100 || count["daybar"] < 2000 || count["not-yet"] < 200 || len(distinct) < 20 {
		t.Fatalf("screenshot lacks parts: %v pixels, %d colours", count, len(distinct))
	}
	// Read top down: the verdict, then the days, then the distribution.
	if firstY["not-yet"] >= firstY["daybar"] || firstY["daybar"] >= firstY["bar"] {
		t.Fatalf("order on the page: %v", firstY)
	}
}
