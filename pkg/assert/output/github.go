package output

import (
	"fmt"
	"io"
	"strings"

	"github.com/budgetgen/budgetgen/internal/safetext"
	"github.com/budgetgen/budgetgen/pkg/assert"
)

// githubWriter writes GitHub Actions workflow commands, which annotate the
// pull request's files:
// ::error file=F,line=L,col=C,title=BG001::message
type githubWriter struct {
	w    io.Writer
	meta Meta
	tally
}

func (g *githubWriter) Write(f assert.Finding) error {
	g.count(f)
	if g.meta.Summary {
		return nil
	}
	level := "error"
	if f.Severity == assert.Warning {
		level = "warning"
	}
	props := []string{"file=" + escapeProperty(f.File)}
	if f.Line > 0 {
		props = append(props, fmt.Sprintf("line=%d", f.Line))
	}
	if f.Column > 0 {
		props = append(props, fmt.Sprintf("col=%d", f.Column))
	}
	props = append(props, "title="+escapeProperty(f.Rule+" "+ruleName(g.meta, f.Rule)))
	msg := f.Message
	if f.Object != "" {
		msg += " (" + f.Object + ")"
	}
	if f.Detail != "" {
		msg += "\n" + f.Detail
	}
	_, err := fmt.Fprintf(g.w, "::%s %s::%s\n", level, strings.Join(props, ","), escapeData(msg))
	return err
}

// Flush writes the summary as one notice annotation (shown on the run's
// summary page), with the per-rule counts, unless Quiet.
func (g *githubWriter) Flush() error {
	if g.meta.Quiet {
		return nil
	}
	msg := g.line(g.meta)
	if rules := g.perRule(g.meta); len(rules) > 0 {
		msg += "\n" + strings.Join(rules, "\n")
	}
	_, err := fmt.Fprintf(g.w, "::notice title=%s::%s\n", escapeProperty("budgetgen assert"), escapeData(msg))
	return err
}

// escapeData and escapeProperty follow the Actions toolkit's command
// escaping, which keeps a value on the command's one line. Other control
// characters (a carriage return, terminal escapes) are first written as Go
// escapes (internal/safetext), since the runner would print them raw.
func escapeData(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A").Replace(safetext.Multiline(s))
}

func escapeProperty(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A", ":", "%3A", ",", "%2C").Replace(safetext.Multiline(s))
}

func ruleName(m Meta, id string) string {
	for _, r := range m.Rules {
		if r.ID == id {
			return r.Name
		}
	}
	return ""
}
