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
	w             io.Writer
	meta          Meta
	errors, warns int
}

func (t *textWriter) Write(f assert.Finding) error {
	if f.Severity == assert.Error {
		t.errors++
	} else {
		t.warns++
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
	status := "ok"
	if t.errors+t.warns > 0 {
		status = "FAIL"
		if t.errors == 0 {
			status = "warnings"
		}
	}
	_, err := fmt.Fprintf(t.w, "budgetgen assert: %s: %s, %s in %s from %s, %s\n", status,
		plural(t.errors, "error"), plural(t.warns, "warning"), plural(t.meta.Objects, "object"), plural(len(t.meta.Files), "file"), plural(len(t.meta.Rules), "rule"))
	return err
}
