package output

import (
	"encoding/xml"
	"fmt"
	"io"

	"github.com/budgetgen/budgetgen/pkg/assert"
)

// junitWriter writes one test suite with a test case per rule that ran: a
// rule with findings fails, with one <failure> per finding, so CI test views
// list passing rules too. No timestamps: output is byte-identical per input.
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
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string         `xml:"name,attr"`
	ClassName string         `xml:"classname,attr"`
	Failures  []junitFailure `xml:"failure"`
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
		c := junitCase{Name: r.ID + " " + r.Name, ClassName: "budgetgen.assert"}
		for _, f := range byRule[r.ID] {
			text := fmt.Sprintf("%s:%d:%d: %s", f.File, f.Line, f.Column, f.Message)
			if f.Object != "" {
				text += " (" + f.Object + ")"
			}
			if f.Detail != "" {
				text += "\n" + f.Detail
			}
			c.Failures = append(c.Failures, junitFailure{Message: f.Message, Type: f.Severity.String(), Text: text})
		}
		if len(c.Failures) > 0 {
			suite.Failures++
		}
		suite.Cases = append(suite.Cases, c)
	}
	suite.Tests = len(suite.Cases)
	doc := junitSuites{Name: "budgetgen", Tests: suite.Tests, Failures: suite.Failures, Suites: []junitSuite{suite}}
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
