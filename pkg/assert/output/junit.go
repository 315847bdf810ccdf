package output

import (
	"encoding/xml"
	"fmt"
	"io"

	"github.com/budgetgen/budgetgen/pkg/assert"
)

// junitWriter writes one test suite in which every finding is its own test
// case (classname = rule ID, name = file:line), so Jenkins and GitLab list
// each finding; a rule that ran clean is one passing case and a rule turned
// off with --skip one <skipped/> case. No timestamps: output is
// byte-identical per input.
type junitWriter struct {
	w        io.Writer
	meta     Meta
	findings []assert.Finding
}

type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Skipped  int          `xml:"skipped,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string         `xml:"name,attr"`
	ClassName string         `xml:"classname,attr"`
	Failures  []junitFailure `xml:"failure"`
	Skipped   *junitSkipped  `xml:"skipped"`
}

type junitSkipped struct {
	Message string `xml:"message,attr"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

func (j *junitWriter) Write(f assert.Finding) error {
	j.findings = append(j.findings, f)
	return nil
}

func (j *junitWriter) Flush() error {
	suite := junitSuite{Name: "budgetgen assert"}
	byRule := map[string][]assert.Finding{}
	for _, f := range j.findings {
		byRule[f.Rule] = append(byRule[f.Rule], f)
	}
	for _, r := range j.meta.Rules {
		fs := byRule[r.ID]
		if len(fs) == 0 {
			suite.Cases = append(suite.Cases, junitCase{Name: r.Name, ClassName: r.ID})
			continue
		}
		for _, f := range fs {
			text := fmt.Sprintf("%s:%d:%d: %s", f.File, f.Line, f.Column, f.Message)
			if f.Object != "" {
				text += " (" + f.Object + ")"
			}
			if f.Detail != "" {
				text += "\n" + f.Detail
			}
			name := f.File
			if f.Line > 0 {
				name = fmt.Sprintf("%s:%d", f.File, f.Line)
			}
			suite.Cases = append(suite.Cases, junitCase{Name: name, ClassName: f.Rule,
				Failures: []junitFailure{{Message: f.Message, Type: f.Severity.String(), Text: text}}})
			suite.Failures++
		}
	}
	for _, id := range j.meta.Skipped {
		name := id
		if r := assert.Lookup(id); r != nil {
			name = r.Name
		}
		suite.Cases = append(suite.Cases, junitCase{Name: name, ClassName: id, Skipped: &junitSkipped{Message: "turned off with --skip " + id}})
		suite.Skipped++
	}
	suite.Tests = len(suite.Cases)
	doc := junitSuites{Name: "budgetgen", Tests: suite.Tests, Failures: suite.Failures, Skipped: suite.Skipped, Suites: []junitSuite{suite}}
	if _, err := io.WriteString(j.w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(j.w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	_, err := io.WriteString(j.w, "\n")
	return err
}
