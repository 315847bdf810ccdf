package spec

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/budgetgen/budgetgen/internal/safetext"
)

// FieldError is one problem in a spec, positioned at its source line.
type FieldError struct {
	File string // as given to Load, e.g. "budgets.yaml"
	Line int    // 1-based; 0 when the BudgetSet was not loaded from a file
	Path string // field path, e.g. "spec.budgets[3].tokensPerDay"
	Msg  string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString(safetext.Inline(e.File)) // one problem per line, whatever the file name holds
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ErrorList is every problem found in a spec, sorted by line then path.
// Load returns it (as error) when it is not empty.
type ErrorList []*FieldError

func (l *ErrorList) add(file string, line int, path, msg string) {
	*l = append(*l, &FieldError{File: file, Line: line, Path: path, Msg: msg})
}

func (l ErrorList) sort() {
	slices.SortStableFunc(l, func(a, b *FieldError) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Path, b.Path))
	})
}

// Error prints one problem per line.
func (l ErrorList) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Unwrap exposes each FieldError to errors.As.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}
