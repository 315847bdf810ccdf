package output

import (
	"encoding/json"
	"io"

	"github.com/budgetgen/budgetgen/pkg/assert"
)

// jsonWriter writes one JSON document: findings plus a summary.
type jsonWriter struct {
	w        io.Writer
	meta     Meta
	findings []assert.Finding
}

type jsonSummary struct {
	Errors   int      `json:"errors"`
	Warnings int      `json:"warnings"`
	Objects  int      `json:"objects"`
	Files    int      `json:"files"`
	Rules    []string `json:"rules"`
}

func (j *jsonWriter) Write(f assert.Finding) error {
	j.findings = append(j.findings, f)
	return nil
}

func (j *jsonWriter) Flush() error {
	doc := struct {
		Findings []assert.Finding `json:"findings"`
		Summary  jsonSummary      `json:"summary"`
	}{Findings: j.findings, Summary: jsonSummary{Objects: j.meta.Objects, Files: len(j.meta.Files), Rules: []string{}}}
	if doc.Findings == nil {
		doc.Findings = []assert.Finding{}
	}
	for _, f := range j.findings {
		if f.Severity == assert.Error {
			doc.Summary.Errors++
		} else {
			doc.Summary.Warnings++
		}
	}
	for _, r := range j.meta.Rules {
		doc.Summary.Rules = append(doc.Summary.Rules, r.ID)
	}
	enc := json.NewEncoder(j.w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}
