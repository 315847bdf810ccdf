package thresholds

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMonitoringDocListsTheCounterLabels: docs/monitoring.md's row of the
// crossings counter names exactly its labels, so a query written from the
// doc selects what the service exports.
func TestMonitoringDocListsTheCounterLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	d, err := New(Options{Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	d.Observe(t.Context(), Charge{Domain: "d", Rule: "r", Limit: 10, Hits: 10, Total: 10, Window: "hour"})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, mf := range mfs {
		if mf.GetName() == MetricName && len(mf.GetMetric()) > 0 {
			for _, l := range mf.GetMetric()[0].GetLabel() {
				want = append(want, l.GetName())
			}
		}
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "| `"+MetricName+"` |") {
			row = line
		}
	}
	cells := strings.Split(row, "|")
	if len(cells) < 4 {
		t.Fatalf("docs/monitoring.md has no table row for %s", MetricName)
	}
	var got []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(cells[2], -1) {
		got = append(got, m[1])
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("docs/monitoring.md lists %s's labels as %v; the counter has %v", MetricName, got, want)
	}
}
