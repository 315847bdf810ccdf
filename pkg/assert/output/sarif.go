package output

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"strings"

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
	FullDescription      sarifMessage `json:"fullDescription"`
	Help                 sarifHelp    `json:"help"`
	HelpURI              string       `json:"helpUri"`
	DefaultConfiguration struct {
		Level string `json:"level"`
	} `json:"defaultConfiguration"`
}

type sarifMessage struct {
	Text string `json:"text"`
}

// sarifHelp is a multiformatMessageString: plain text plus Markdown.
type sarifHelp struct {
	Text     string `json:"text"`
	Markdown string `json:"markdown"`
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
		url := ruleURL(r.ID)
		full := fmt.Sprintf("%s (%s, severity %s). Turn it off with --skip %s; the rule's entry in docs/assert.md says what it checks and how to fix a finding.", r.Doc, r.Name, r.Severity, r.ID)
		sr := sarifRule{
			ID: r.ID, Name: r.Name, ShortDescription: sarifMessage{r.Doc}, FullDescription: sarifMessage{full}, HelpURI: url,
			Help: sarifHelp{
				Text:     fmt.Sprintf("%s %s: %s\n\nSeverity: %s. Documentation: %s", r.ID, r.Name, r.Doc, r.Severity, url),
				Markdown: fmt.Sprintf("**%s %s**: %s\n\nSeverity: %s. See [%s in docs/assert.md](%s).", r.ID, r.Name, markdownText(r.Doc), r.Severity, r.ID, url),
			},
		}
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
		loc.PhysicalLocation.ArtifactLocation.URI = fileURI(f.File)
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

// StdinURI names stdin ("-") in SARIF, where every location must be a URI.
const StdinURI = "file:///dev/stdin"

// fileURI turns a path as the user gave it into a URI reference: relative
// paths stay relative (code scanning resolves them against the checkout),
// absolute ones become file:// URIs, stdin is StdinURI, and every character
// outside a URI path is percent-encoded.
func fileURI(p string) string {
	switch {
	case p == "-" || p == "<stdin>" || p == "": // the manifest reader names stdin <stdin>
		return StdinURI
	case strings.HasPrefix(p, "/"):
		return (&url.URL{Scheme: "file", Path: p}).String()
	}
	u := (&url.URL{Path: filepath.ToSlash(p)}).String()
	// A relative path whose first segment has a colon would read as a scheme.
	if first, _, _ := strings.Cut(u, "/"); strings.Contains(first, ":") {
		u = "./" + u
	}
	return u
}

// markdownText escapes the characters Markdown would take as markup.
func markdownText(s string) string {
	return strings.NewReplacer(`\`, `\\`, "*", `\*`, "_", `\_`, "`", "\\`", "[", `\[`, "]", `\]`, "<", "&lt;", ">", "&gt;").Replace(s)
}
