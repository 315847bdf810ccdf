package output

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"net/url"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/assert"
)

// hostile is a finding whose every input-derived field tries to forge a
// GitHub Actions workflow command or smuggle terminal escapes.
var hostile = assert.Finding{
	Rule: "BG008", Severity: assert.Error, Line: 2, Column: 1,
	File:    "evil\n::error file=forged.yaml,line=1::forged by file name\r\x1b[2K.yaml",
	Object:  "HTTPRoute ns/x\n::warning::forged by object",
	Message: "differs\n::error::forged by message %0A 100%",
	Detail:  "--- committed\n::error::forged by detail\n  ::notice::indented\x1b]0;title\x07\n+ ok",
}

// workflowCommands returns the output lines a GitHub runner would execute:
// those starting, after blanks, with "::".
func workflowCommands(out string) []string {
	var cmds []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimLeft(l, " \t"), "::") {
			cmds = append(cmds, l)
		}
	}
	return cmds
}

func writeOne(t *testing.T, format string, f assert.Finding) string {
	t.Helper()
	var buf bytes.Buffer
	w, err := New(format, &buf, Meta{Rules: []*assert.Rule{{ID: "BG008", Name: "drift", Severity: assert.Error}}, Files: []string{f.File}})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteAll(w, []assert.Finding{f}); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

func TestEveryFormatEscapesInput(t *testing.T) {
	for _, format := range Formats() {
		t.Run(format, func(t *testing.T) {
			out := writeOne(t, format, hostile)
			cmds := workflowCommands(out)
			if format == GitHub {
				// Exactly the one genuine annotation, with the file name
				// and title escaped as properties and the message as data,
				// then the run's summary notice.
				if len(cmds) != 2 || strings.Count(out, "\n") != 2 || !strings.HasPrefix(cmds[0], "::error ") || !strings.HasPrefix(cmds[1], "::notice title=budgetgen assert::") {
					t.Fatalf("want one annotation line and the summary notice, got %d:\n%s", len(cmds), out)
				}
				for _, want := range []string{"file=evil%0A%3A%3Aerror file=forged.yaml%2Cline=1%3A%3Aforged by file name\\r\\x1b[2K.yaml,", "::differs%0A::error::forged by message %250A 100%25"} {
					if !strings.Contains(out, want) {
						t.Errorf("missing %q in\n%q", want, out)
					}
				}
			} else if len(cmds) != 0 {
				t.Fatalf("%s output forges workflow commands %q:\n%s", format, cmds, out)
			}
			for _, r := range out {
				if r != '\n' && r != '\t' && (r < 0x20 || r == 0x7f) {
					t.Fatalf("%s output holds control character %U:\n%q", format, r, out)
				}
			}
		})
	}
}

// The structured formats keep the values exact (their encoders escape), so a
// consumer reads back what the gate saw.
func TestStructuredFormatsRoundTrip(t *testing.T) {
	var j struct {
		Findings []map[string]any `json:"findings"`
	}
	if err := json.Unmarshal([]byte(writeOne(t, JSON, hostile)), &j); err != nil || len(j.Findings) != 1 {
		t.Fatalf("json: %v", err)
	}
	if g := j.Findings[0]; g["file"] != hostile.File || g["message"] != hostile.Message || g["object"] != hostile.Object || g["detail"] != hostile.Detail {
		t.Errorf("json changed the values: %+v", g)
	}
	var s sarifLog
	if err := json.Unmarshal([]byte(writeOne(t, SARIF, hostile)), &s); err != nil {
		t.Fatal(err)
	}
	r := s.Runs[0].Results[0]
	uri := r.Locations[0].PhysicalLocation.ArtifactLocation.URI
	// A relative path whose first segment holds a colon is written "./..."
	// so it cannot read as a URI scheme.
	if file, err := url.PathUnescape(strings.TrimPrefix(uri, "./")); err != nil || file != hostile.File || r.Message.Text != hostile.Message+"\n"+hostile.Detail {
		t.Errorf("sarif changed the values: %+v (%v)", r, err)
	}
	if strings.ContainsAny(uri, "\n\r\x1b ") {
		t.Errorf("sarif artifact URI not percent-encoded: %q", uri)
	}
	var ju junitSuites
	if err := xml.Unmarshal([]byte(writeOne(t, JUnit, hostile)), &ju); err != nil {
		t.Fatal(err)
	}
	// XML 1.0 cannot hold ESC or BEL: encoding/xml writes U+FFFD for them.
	f := ju.Suites[0].Cases[0].Failures[0]
	if f.Message != hostile.Message || !strings.HasPrefix(f.Text, strings.ReplaceAll(hostile.File, "\x1b", "\ufffd")+":2:1: ") {
		t.Errorf("junit changed the values: %+v", f)
	}
}

func TestTextEscapes(t *testing.T) {
	out := writeOne(t, Text, hostile)
	want := `evil\n::error file=forged.yaml,line=1::forged by file name\r\x1b[2K.yaml:2:1: BG008 error: differs\n::error::forged by message %0A 100% (HTTPRoute ns/x\n::warning::forged by object)` + "\n" +
		"    --- committed\n" +
		`    \x3a:error::forged by detail` + "\n" +
		`      \x3a:notice::indented\x1b]0;title\x07` + "\n" +
		"    + ok\n"
	if !strings.HasPrefix(out, want) {
		t.Errorf("text output:\n%s\nwant prefix:\n%s", out, want)
	}
}
