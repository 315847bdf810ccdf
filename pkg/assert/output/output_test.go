package output

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/internal/manifest"
	"github.com/budgetgen/budgetgen/pkg/assert"
)

var update = flag.Bool("update", false, "rewrite golden files")

// report runs the gate over two rule fixtures (errors and a warning) and adds
// a finding with multi-line detail and characters every format must escape.
func report(t *testing.T) (*assert.Report, Meta) {
	t.Helper()
	var objs []*manifest.Object
	for _, p := range []string{"../testdata/rules/bg001_not_shared.yaml", "../testdata/rules/bg010_shared_cost.yaml"} {
		o, err := manifest.ReadPaths(context.Background(), []string{p}, nil, manifest.Options{})
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o...)
	}
	rep, err := assert.Run(context.Background(), objs, assert.Options{EnvoyGatewayVersion: "v1.8.1", Skip: []string{"BG013"}}) // no AIGatewayRoute in these fixtures
	if err != nil {
		t.Fatal(err)
	}
	rep.Findings = append(rep.Findings, assert.Finding{
		Rule: "BG008", Severity: assert.Error, File: "rendered/a,b.yaml", Line: 3, Column: 1, Object: "BackendTrafficPolicy gw/x",
		Message: `differs: 100% "quoted" <tag> & more`, Detail: "--- committed\n+++ rendered\n-  shared: false\n+  shared: true\n",
	})
	assert.SortFindings(rep.Findings)
	return rep, Meta{Rules: rep.Rules, Objects: rep.Objects, Files: rep.Files, ToolVersion: "v0.0.0-test"}
}

func TestGolden(t *testing.T) {
	rep, meta := report(t)
	for _, format := range Formats() {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			w, err := New(format, &buf, meta)
			if err != nil {
				t.Fatal(err)
			}
			if err := WriteAll(w, rep.Findings); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", format+".golden")
			if *update {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("%s output differs from %s:\n%s", format, golden, buf.String())
			}
			// Same input, byte-identical output.
			var again bytes.Buffer
			w2, _ := New(format, &again, meta)
			if err := WriteAll(w2, rep.Findings); err != nil || !bytes.Equal(again.Bytes(), buf.Bytes()) {
				t.Errorf("second write differs (%v)", err)
			}
		})
	}
}

func TestFormatsParse(t *testing.T) {
	rep, meta := report(t)
	write := func(format string) []byte {
		var buf bytes.Buffer
		w, err := New(format, &buf, meta)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteAll(w, rep.Findings); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	var j struct {
		Findings []map[string]any `json:"findings"`
		Summary  struct{ Errors, Warnings int }
	}
	if err := json.Unmarshal(write(JSON), &j); err != nil || len(j.Findings) != len(rep.Findings) || j.Summary.Warnings != 1 {
		t.Errorf("json: %v %+v", err, j.Summary)
	}
	var s sarifLog
	if err := json.Unmarshal(write(SARIF), &s); err != nil || len(s.Runs[0].Results) != len(rep.Findings) || s.Runs[0].Results[0].Locations[0].PhysicalLocation.Region.StartLine == 0 {
		t.Errorf("sarif: %v", err)
	}
	var ju junitSuites
	if err := xml.Unmarshal(write(JUnit), &ju); err != nil || ju.Tests != len(meta.Rules) || ju.Failures != 3 {
		t.Errorf("junit: %v tests=%d failures=%d", err, ju.Tests, ju.Failures)
	}
	gh := string(write(GitHub))
	if strings.Count(gh, "\n") != len(rep.Findings) || !strings.Contains(gh, "file=rendered/a%2Cb.yaml") || !strings.Contains(gh, "100%25") {
		t.Errorf("github annotations not one per line or not escaped:\n%s", gh)
	}
}

func TestUnknownFormat(t *testing.T) {
	if _, err := New("yaml", &bytes.Buffer{}, Meta{}); err == nil || !strings.Contains(err.Error(), "sarif") {
		t.Errorf("unknown format: %v", err)
	}
}
