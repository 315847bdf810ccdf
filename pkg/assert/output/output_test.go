package output

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/assert"
	"github.com/budgetgen/budgetgen/pkg/manifest"
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
	// One case per finding, one per rule without findings.
	if err := xml.Unmarshal(write(JUnit), &ju); err != nil || ju.Tests != len(meta.Rules)-3+len(rep.Findings) || ju.Failures != len(rep.Findings) {
		t.Errorf("junit: %v tests=%d failures=%d", err, ju.Tests, ju.Failures)
	}
	gh := string(write(GitHub))
	if strings.Count(gh, "\n") != len(rep.Findings)+1 || !strings.Contains(gh, "file=rendered/a%2Cb.yaml") || !strings.Contains(gh, "100%25") {
		t.Errorf("github annotations not one per line or not escaped:\n%s", gh)
	}
}

func TestUnknownFormat(t *testing.T) {
	if _, err := New("yaml", &bytes.Buffer{}, Meta{}); err == nil || !strings.Contains(err.Error(), "sarif") {
		t.Errorf("unknown format: %v", err)
	}
}

// githubRequired lists the SARIF fields GitHub code scanning requires or
// uses to show a result (docs.github.com, "SARIF support for code
// scanning"). The official OASIS schema is not vendored: the sarif-spec
// repository is under the OASIS IPR policy, not an open-source licence.
//
//	$schema, version "2.1.0", runs[].tool.driver.name, .version (not "(devel)"),
//	.rules[]: id, name, shortDescription.text, fullDescription.text,
//	  help.text, help.markdown, helpUri, defaultConfiguration.level;
//	runs[].results[]: ruleId, ruleIndex (pointing at that rule), level in
//	  none|note|warning|error, message.text, locations[] with
//	  physicalLocation.artifactLocation.uri a valid URI reference and
//	  region.startLine >= 1, startColumn >= 1 when present.
func checkSARIF(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("sarif is not JSON: %v", err)
	}
	str := func(m map[string]any, path ...string) string {
		var cur any = m
		for _, p := range path {
			mm, ok := cur.(map[string]any)
			if !ok {
				return ""
			}
			cur = mm[p]
		}
		s, _ := cur.(string)
		return s
	}
	if doc["version"] != "2.1.0" || !strings.Contains(str(doc, "$schema"), "sarif") {
		t.Fatalf("version/schema: %v %v", doc["version"], doc["$schema"])
	}
	runs, _ := doc["runs"].([]any)
	if len(runs) != 1 {
		t.Fatalf("runs %v", runs)
	}
	run := runs[0].(map[string]any)
	driver := run["tool"].(map[string]any)["driver"].(map[string]any)
	if driver["name"] != "budgetgen" || str(driver, "version") == "" || str(driver, "version") == "(devel)" {
		t.Errorf("driver %v", driver)
	}
	rules, _ := driver["rules"].([]any)
	ids := map[string]int{}
	for i, r := range rules {
		rm := r.(map[string]any)
		for _, p := range [][]string{{"id"}, {"name"}, {"shortDescription", "text"}, {"fullDescription", "text"}, {"help", "text"}, {"help", "markdown"}, {"helpUri"}, {"defaultConfiguration", "level"}} {
			if str(rm, p...) == "" {
				t.Errorf("rule %v lacks %v", rm["id"], p)
			}
		}
		if str(rm, "fullDescription", "text") == str(rm, "shortDescription", "text") {
			t.Errorf("rule %v: fullDescription repeats shortDescription", rm["id"])
		}
		if u, err := url.Parse(str(rm, "helpUri")); err != nil || !u.IsAbs() || u.Fragment != strings.ToLower(str(rm, "id")) {
			t.Errorf("rule %v helpUri %q", rm["id"], str(rm, "helpUri"))
		}
		ids[str(rm, "id")] = i
	}
	results, _ := run["results"].([]any)
	for _, r := range results {
		rm := r.(map[string]any)
		id := str(rm, "ruleId")
		idx, ok := ids[id]
		if !ok || int(rm["ruleIndex"].(float64)) != idx {
			t.Errorf("result %v: ruleIndex %v, rule at %d", id, rm["ruleIndex"], idx)
		}
		if lv := str(rm, "level"); lv != "error" && lv != "warning" && lv != "note" && lv != "none" {
			t.Errorf("level %q", lv)
		}
		if str(rm, "message", "text") == "" {
			t.Errorf("result %v without message", id)
		}
		locs, _ := rm["locations"].([]any)
		if len(locs) == 0 {
			t.Fatalf("result %v without location", id)
		}
		pl := locs[0].(map[string]any)["physicalLocation"].(map[string]any)
		uri := str(pl, "artifactLocation", "uri")
		if u, err := url.Parse(uri); err != nil || uri == "" || uri == "-" || strings.ContainsAny(uri, " \\<>\"{}|^`") || (!u.IsAbs() && strings.Contains(strings.SplitN(uri, "/", 2)[0], ":")) {
			t.Errorf("result %v: uri %q is not a valid URI reference (%v)", id, uri, err)
		}
		if reg, ok := pl["region"].(map[string]any); ok {
			if reg["startLine"].(float64) < 1 {
				t.Errorf("startLine %v", reg["startLine"])
			}
			if c, ok := reg["startColumn"]; ok && c.(float64) < 1 {
				t.Errorf("startColumn %v", c)
			}
		}
	}
	return doc
}

func TestSARIFCodeScanningFields(t *testing.T) {
	rep, meta := report(t)
	// Awkward file names: stdin, spaces, an absolute path, a colon.
	extra := []assert.Finding{
		{Rule: "BG001", Severity: assert.Error, File: "-", Line: 2, Column: 1, Message: "from stdin"},
		{Rule: "BG001", Severity: assert.Error, File: "<stdin>", Line: 3, Column: 1, Message: "from stdin, as the reader names it"},
		{Rule: "BG001", Severity: assert.Error, File: "my dir/a b.yaml", Line: 1, Message: "spaces"},
		{Rule: "BG001", Severity: assert.Error, File: "/abs/x y.yaml", Line: 1, Message: "absolute"},
		{Rule: "BG001", Severity: assert.Error, File: "c:d.yaml", Line: 1, Message: "colon"},
	}
	fs := append(append([]assert.Finding{}, rep.Findings...), extra...)
	var buf bytes.Buffer
	w, _ := New(SARIF, &buf, meta)
	if err := WriteAll(w, fs); err != nil {
		t.Fatal(err)
	}
	checkSARIF(t, buf.Bytes())
	for _, want := range []string{`"uri": "file:///dev/stdin"`, `"uri": "my%20dir/a%20b.yaml"`, `"uri": "file:///abs/x%20y.yaml"`, `"uri": "./c:d.yaml"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("no %s", want)
		}
	}
	// Every rule's helpUri anchor is a heading of docs/assert.md.
	doc, err := os.ReadFile("../../../docs/assert.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range assert.Rules() {
		if !strings.Contains(string(doc), "\n### "+r.ID+"\n") {
			t.Errorf("docs/assert.md has no heading for %s (anchor #%s)", r.ID, strings.ToLower(r.ID))
		}
	}
}

func TestJUnitOneCasePerFinding(t *testing.T) {
	rep, meta := report(t)
	meta.Skipped = []string{"BG007"}
	var buf bytes.Buffer
	w, _ := New(JUnit, &buf, meta)
	if err := WriteAll(w, rep.Findings); err != nil {
		t.Fatal(err)
	}
	var ju junitSuites
	if err := xml.Unmarshal(buf.Bytes(), &ju); err != nil {
		t.Fatal(err)
	}
	cases := ju.Suites[0].Cases
	byRule := map[string]int{}
	failures, skipped := 0, 0
	for _, c := range cases {
		if len(c.Failures) > 0 {
			failures++
			byRule[c.ClassName]++
		}
		if c.Skipped != nil {
			skipped++
			if c.ClassName != "BG007" {
				t.Errorf("skipped %+v", c)
			}
		}
	}
	if failures != len(rep.Findings) || ju.Failures != failures || skipped != 1 || ju.Skipped != 1 || ju.Tests != len(cases) {
		t.Fatalf("failures %d/%d skipped %d tests %d cases %d", failures, len(rep.Findings), skipped, ju.Tests, len(cases))
	}
	for _, f := range rep.Findings {
		found := false
		for _, c := range cases {
			found = found || (c.ClassName == f.Rule && c.Name == fmt.Sprintf("%s:%d", f.File, f.Line))
		}
		if !found {
			t.Errorf("no test case %s %s:%d", f.Rule, f.File, f.Line)
		}
	}
	if !strings.Contains(buf.String(), `<skipped message="turned off with --skip BG007"></skipped>`) {
		t.Errorf("skipped element:\n%s", buf.String())
	}
}

func TestSummaryAndQuiet(t *testing.T) {
	rep, meta := report(t)
	write := func(format string, m Meta, fs []assert.Finding) string {
		var buf bytes.Buffer
		w, _ := New(format, &buf, m)
		if err := WriteAll(w, fs); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	sum := meta
	sum.Summary = true
	if out := write(Text, sum, rep.Findings); strings.Contains(out, "differs:") || !strings.Contains(out, "  BG001 shared: 2 findings\n") || !strings.HasSuffix(out, fmt.Sprintf("%d rules\n", len(meta.Rules))) {
		t.Errorf("text --summary:\n%s", out)
	}
	q := meta
	q.Quiet = true
	if out := write(Text, q, rep.Findings); strings.Contains(out, "budgetgen assert:") || strings.Count(out, ": BG") != len(rep.Findings) {
		t.Errorf("text --quiet:\n%s", out)
	}
	if out := write(Text, q, nil); out != "" {
		t.Errorf("text --quiet when clean: %q", out)
	}
	gh := write(GitHub, meta, rep.Findings)
	lines := strings.Split(strings.TrimSuffix(gh, "\n"), "\n")
	last := lines[len(lines)-1]
	if len(lines) != len(rep.Findings)+1 || !strings.HasPrefix(last, "::notice title=budgetgen assert::budgetgen assert: FAIL: 3 errors, 1 warning") || !strings.Contains(last, "%0ABG001 shared: 2 findings") {
		t.Errorf("github summary annotation:\n%s", gh)
	}
	if out := write(GitHub, sum, rep.Findings); strings.Contains(out, "::error") || !strings.HasPrefix(out, "::notice") {
		t.Errorf("github --summary:\n%s", out)
	}
	if out := write(GitHub, q, rep.Findings); strings.Contains(out, "::notice") {
		t.Errorf("github --quiet:\n%s", out)
	}
}
