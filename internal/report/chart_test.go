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
)

// chartCases are report shapes that stress the chart layout.
func chartCases() map[string]*Report {
	out := map[string]*Report{}
	mk := func(name string, capv uint64, usage func(i int) map[string]uint64) {
		m := Mapping{Rules: map[ledger.RuleID]RuleInfo{ruleRun: {Budget: name, Kind: KindTokens, Cap: capv}}, Budgets: map[string]BudgetInfo{name: {Mode: "shadow", Cap: capv}}}
		var data []ledger.DayData
		for i := 0; i < 7; i++ {
			data = append(data, ledger.DayData{Rule: ruleRun, Day: ledger.DayOf(now) - ledger.Day(7-i), Usage: usage(i), ShadowDenials: 3})
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
	// One runaway at 40x everyone else: log scale.
	mk("runaway", 5_000_000, func(i int) map[string]uint64 {
		u := map[string]uint64{"runaway": 80_000_000}
		for p := 0; p < 30; p++ {
			u[fmt.Sprintf("run-%d", p)] = uint64(100_000 + 60_000*p)
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
			svg := regexp.MustCompile(`(?s)<svg class="chart".*?</svg>`).FindString(h)
			if svg == "" {
				t.Fatal("no chart")
			}
			w, ht, boxes, texts := svgLabels(t, svg)
			if w != chartW || ht != chartH || len(texts) < 6 {
				t.Fatalf("viewBox %vx%v, %d labels", w, ht, len(texts))
			}
			var all []string
			for _, tx := range texts {
				all = append(all, tx.Text)
			}
			joined := strings.Join(all, "|")
			for _, want := range []string{"tokens per principal-day", "principal-days", "cap ", "suggested "} {
				if !strings.Contains(joined, want) {
					t.Errorf("no %q label in %q", want, joined)
				}
			}
			// Tick labels on both axes: "0" on y, and at least 3 numbers on x.
			var xTicks, yTicks int
			for _, tx := range texts {
				if tx.Anchor == "end" && tx.X < plotLeft {
					yTicks++
				}
				if tx.Y == chartH-plotBottom+xTickDY {
					xTicks++
				}
			}
			if xTicks < 3 || yTicks < 2 {
				t.Errorf("ticks: %d on x, %d on y", xTicks, yTicks)
			}
			for i, b := range boxes {
				if b.x0 < 0 || b.y0 < 0 || b.x1 > w || b.y1 > ht {
					t.Errorf("label %q at %+v leaves the viewBox %vx%v", texts[i].Text, b, w, ht)
				}
				for j := i + 1; j < len(boxes); j++ {
					if b.overlaps(boxes[j]) {
						t.Errorf("labels %q and %q overlap: %+v %+v", texts[i].Text, texts[j].Text, b, boxes[j])
					}
				}
			}
			if log := strings.Contains(svg, `data-scale="log"`); log != (name == "runaway") {
				t.Errorf("log scale %v for %s", log, name)
			}
		})
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

// Screenshot renders path at 1280 px wide in headless Chromium.
func screenshot(t *testing.T, browser, page, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir="+t.TempDir(),
		"--hide-scrollbars", "--screenshot="+out, "--window-size=1280,900", "file://"+page)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, b)
	}
}

func TestChartScreenshot(t *testing.T) {
	browser := chromium(t)
	dir := t.TempDir()
	which := "runaway"
	if c := os.Getenv("BUDGETGEN_SCREENSHOT_CASE"); c != "" { // look at another case
		which = c
	}
	r := chartCases()[which]
	page := filepath.Join(dir, "report.html")
	if err := os.WriteFile(page, []byte(renderHTML(t, r)), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "report.png")
	screenshot(t, browser, page, out)
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
	// Not blank: the bars' blue and the cap's red are on the page.
	near := func(r, g, b uint32, R, G, B int) bool {
		d := func(a uint32, c int) int { x := int(a>>8) - c; return max(x, -x) }
		return d(r, R) < 24 && d(g, G) < 24 && d(b, B) < 24
	}
	var bars, capPx, colors = 0, 0, map[[3]uint32]bool{}
	bnd := img.Bounds()
	for y := bnd.Min.Y; y < bnd.Max.Y; y++ {
		for x := bnd.Min.X; x < bnd.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			colors[[3]uint32{r >> 8, g >> 8, b >> 8}] = true
			if near(r, g, b, 0x4a, 0x7b, 0xd0) {
				bars++
			}
			if near(r, g, b, 0xc0, 0x39, 0x2b) {
				capPx++
			}
		}
	}
	if which != "runaway" {
		return
	}
	if bars < 200 || capPx < 100 || len(colors) < 20 {
		t.Fatalf("screenshot looks blank: %d bar pixels, %d cap pixels, %d colours", bars, capPx, len(colors))
	}
}
