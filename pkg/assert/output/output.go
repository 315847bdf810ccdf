// Package output writes assert findings in the formats CI systems read: one
// file per format behind the two-method Writer interface, in the manner of
// conftest's and kubeconform's output packages. An unknown format is an
// error, never a silent fallback to text.
package output

import (
	"fmt"
	"io"
	"strings"

	"github.com/budgetgen/budgetgen/pkg/assert"
)

// Writer receives findings in order and writes its format on Flush (or as it goes).
type Writer interface {
	Write(assert.Finding) error
	Flush() error
}

// Format names.
const (
	Text   = "text"
	JSON   = "json"
	GitHub = "github"
	JUnit  = "junit"
	SARIF  = "sarif"
)

// Formats lists the format names, for flag help.
func Formats() []string { return []string{Text, JSON, GitHub, JUnit, SARIF} }

// DocsURL is where each rule's documentation lives (anchor: the lowercase ID).
const DocsURL = "https://github.com/budgetgen/budgetgen/blob/main/docs/assert.md"

// Meta is what formats need beyond the findings.
type Meta struct {
	// Rules that ran (JUnit test cases, SARIF rule metadata).
	Rules []*assert.Rule
	// Objects and Files checked (summaries).
	Objects int
	Files   []string
	// ToolVersion is budgetgen's version (SARIF).
	ToolVersion string
	// Skipped are the IDs of rules turned off (--skip), sorted: JUnit lists
	// them as skipped test cases.
	Skipped []string
	// Summary makes text and github write only the summary (no finding
	// lines); Quiet makes them write only the findings (no summary).
	Summary, Quiet bool
	// NoBudgetPolicy says the input holds no budget policy and the run fails
	// for it (budgetgen assert without --allow-empty): the text and github
	// summaries then say FAIL, not ok, even with no finding.
	NoBudgetPolicy bool
}

// New returns the Writer for format.
func New(format string, w io.Writer, meta Meta) (Writer, error) {
	switch strings.ToLower(format) {
	case Text, "":
		return &textWriter{w: w, meta: meta}, nil
	case JSON:
		return &jsonWriter{w: w, meta: meta}, nil
	case GitHub:
		return &githubWriter{w: w, meta: meta}, nil
	case JUnit:
		return &junitWriter{w: w, meta: meta}, nil
	case SARIF:
		return &sarifWriter{w: w, meta: meta}, nil
	}
	return nil, fmt.Errorf("unknown output format %q (want one of %s)", format, strings.Join(Formats(), ", "))
}

// WriteAll writes every finding and flushes.
func WriteAll(w Writer, fs []assert.Finding) error {
	for _, f := range fs {
		if err := w.Write(f); err != nil {
			return err
		}
	}
	return w.Flush()
}

func ruleURL(id string) string { return DocsURL + "#" + strings.ToLower(id) }

func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}
