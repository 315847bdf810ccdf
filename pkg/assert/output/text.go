package output

import (
	"fmt"
	"io"
	"strings"

	"github.com/budgetgen/budgetgen/internal/safetext"
	"github.com/budgetgen/budgetgen/pkg/assert"
)

// textWriter writes "file:line:col: ID severity: message (object)" per finding,
// detail indented below, and a one-line summary. Values from input are
// escaped (internal/safetext): no control character reaches the terminal and
// no line can be read as a CI workflow command.
type textWriter struct {
	w    io.Writer
	meta Meta
	tally
}

// tally counts findings for the summaries.
type tally struct {
	errors, warns int
	byRule        map[string]int
}

func (t *tally) count(f assert.Finding) {
	if f.Severity == assert.Error {
		t.errors++
	} else {
		t.warns++
	}
	if t.byRule == nil {
		t.byRule = map[string]int{}
	}
	t.byRule[f.Rule]++
}

// line is the one-line summary: status, counts, what was checked.
func (t *tally) line(m Meta) string {
	status := "ok"
	if t.errors+t.warns > 0 {
		status = "FAIL"
		if t.errors == 0 {
			status = "warnings"
		}
	}
	if m.NoBudgetPolicy {
		status = "FAIL: no budget policy"
	}
	s := fmt.Sprintf("budgetgen assert: %s: %s, %s in %s from %s, %s", status,
		plural(t.errors, "error"), plural(t.warns, "warning"), plural(m.Objects, "object"), plural(len(m.Files), "file"), plural(len(m.Rules), "rule"))
	if len(m.Skipped) > 0 {
		s += ", skipped " + strings.Join(m.Skipped, ",")
	}
	return s
}

// perRule lists "BG001 name: n" for rules with findings, in rule order.
func (t *tally) perRule(m Meta) []string {
	var out []string
	for _, r := range m.Rules {
		if n := t.byRule[r.ID]; n > 0 {
			out = append(out, fmt.Sprintf("%s %s: %s", r.ID, r.Name, plural(n, "finding")))
		}
	}
	return out
}

func (t *textWriter) Write(f assert.Finding) error {
	t.count(f)
	if t.meta.Summary {
		return nil
	}
	pos := safetext.Inline(f.File)
	if f.Line > 0 {
		pos = fmt.Sprintf("%s:%d", pos, f.Line)
		if f.Column > 0 {
			pos = fmt.Sprintf("%s:%d", pos, f.Column)
		}
	}
	obj := ""
	if f.Object != "" {
		obj = " (" + safetext.Inline(f.Object) + ")"
	}
	line := fmt.Sprintf("%s: %s %s: %s%s", pos, safetext.Inline(f.Rule), f.Severity, safetext.Inline(f.Message), obj)
	if _, err := fmt.Fprintln(t.w, safetext.Line(line)); err != nil {
		return err
	}
	if f.Detail != "" {
		for _, line := range strings.Split(strings.TrimRight(f.Detail, "\n"), "\n") {
			if _, err := fmt.Fprintln(t.w, safetext.Line("    "+line)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (t *textWriter) Flush() error {
	if t.meta.Quiet {
		return nil
	}
	if t.meta.Summary {
		for _, l := range t.perRule(t.meta) {
			if _, err := fmt.Fprintf(t.w, "  %s\n", l); err != nil {
				return err
			}
		}
	}
	_, err := fmt.Fprintln(t.w, t.line(t.meta))
	return err
}
