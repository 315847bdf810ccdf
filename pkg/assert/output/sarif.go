package output

import (
	"encoding/json"
	"io"
	"net/url"
	"path/filepath"

	"github.com/budgetgen/budgetgen/pkg/assert"
)

// sarifWriter writes SARIF 2.1.0 (GitHub code scanning, most IDEs): one run,
// the rules that ran as reportingDescriptors, one result per finding.
type sarifWriter struct {
	w        io.Writer
	meta     Meta
	findings []assert.Finding
}

type sarifLog struct {
	Schema  string     `json:"$schema"`
	Version string     `json:"version"`
	Runs    []sarifRun `json:"runs"`
}

type sarifRun struct {
	Tool    sarifTool     `json:"tool"`
	Results []sarifResult `json:"results"`
}

type sarifTool struct {
	Driver sarifDriver `json:"driver"`
}

type sarifDriver struct {
	Name           string      `json:"name"`
	Version        string      `json:"version,omitempty"`
	InformationURI string      `json:"informationUri"`
	Rules          []sarifRule `json:"rules"`
}

type sarifRule struct {
	ID                   string       `json:"id"`
	Name                 string       `json:"name"`
	ShortDescription     sarifMessage `json:"shortDescription"`
	HelpURI              string       `json:"helpUri"`
	DefaultConfiguration struct {
		Level string `json:"level"`
	} `json:"defaultConfiguration"`
}

type sarifMessage struct {
	Text string `json:"text"`
}

type sarifResult struct {
	RuleID    string          `json:"ruleId"`
	RuleIndex int             `json:"ruleIndex"`
	Level     string          `json:"level"`
	Message   sarifMessage    `json:"message"`
	Locations []sarifLocation `json:"locations"`
}

type sarifLocation struct {
	PhysicalLocation struct {
		ArtifactLocation struct {
			URI string `json:"uri"`
		} `json:"artifactLocation"`
		Region *sarifRegion `json:"region,omitempty"`
	} `json:"physicalLocation"`
	LogicalLocations []sarifLogical `json:"logicalLocations,omitempty"`
}

type sarifRegion struct {
	StartLine   int `json:"startLine"`
	StartColumn int `json:"startColumn,omitempty"`
}

type sarifLogical struct {
	FullyQualifiedName string `json:"fullyQualifiedName"`
}

func level(s assert.Severity) string {
	if s == assert.Warning {
		return "warning"
	}
	return "error"
}

func (s *sarifWriter) Write(f assert.Finding) error {
	s.findings = append(s.findings, f)
	return nil
}

func (s *sarifWriter) Flush() error {
	driver := sarifDriver{Name: "budgetgen", Version: s.meta.ToolVersion, InformationURI: DocsURL, Rules: []sarifRule{}}
	index := map[string]int{}
	for i, r := range s.meta.Rules {
		sr := sarifRule{ID: r.ID, Name: r.Name, ShortDescription: sarifMessage{r.Doc}, HelpURI: ruleURL(r.ID)}
		sr.DefaultConfiguration.Level = level(r.Severity)
		driver.Rules = append(driver.Rules, sr)
		index[r.ID] = i
	}
	run := sarifRun{Tool: sarifTool{Driver: driver}, Results: []sarifResult{}}
	for _, f := range s.findings {
		msg := f.Message
		if f.Detail != "" {
			msg += "\n" + f.Detail
		}
		res := sarifResult{RuleID: f.Rule, RuleIndex: index[f.Rule], Level: level(f.Severity), Message: sarifMessage{msg}}
		var loc sarifLocation
		loc.PhysicalLocation.ArtifactLocation.URI = artifactURI(f.File)
		if f.Line > 0 {
			loc.PhysicalLocation.Region = &sarifRegion{StartLine: f.Line, StartColumn: f.Column}
		}
		if f.Object != "" {
			loc.LogicalLocations = []sarifLogical{{FullyQualifiedName: f.Object}}
		}
		res.Locations = []sarifLocation{loc}
		run.Results = append(run.Results, res)
	}
	enc := json.NewEncoder(s.w)
	enc.SetIndent("", "  ")
	return enc.Encode(sarifLog{Schema: "https://json.schemastore.org/sarif-2.1.0.json", Version: "2.1.0", Runs: []sarifRun{run}})
}

// artifactURI writes a file path as the relative URI reference SARIF wants:
// characters a URI path cannot hold (spaces, '%', control characters, a
// newline in a hostile file name) are percent-encoded, '/' separates.
func artifactURI(path string) string {
	return (&url.URL{Path: filepath.ToSlash(path)}).EscapedPath()
}
