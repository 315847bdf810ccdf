// Package yamlpos reads YAML with positions: it parses documents into
// yaml.v3 nodes within bounds (size after alias expansion, depth), turns the
// parser's syntax errors into positioned errors, and decodes nodes into Go
// values by struct tag while remembering where every field path came from and
// collecting every problem, each as one Error naming file, line, column where
// known, and field path. budgetgen's loaders (the BudgetSet spec, the budget
// map, the rate limit service's config files, the manifest reader of the
// gate) all read through it, so a problem reads the same in every file.
package yamlpos

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/internal/safetext"
)

// Pos is a place in a YAML file: 1-based line and column, 0 when unknown.
type Pos struct {
	Line, Column int
}

// At is the position of a node (the zero Pos for nil).
func At(n *yaml.Node) Pos {
	if n == nil {
		return Pos{}
	}
	return Pos{Line: n.Line, Column: n.Column}
}

// Error is one problem in a YAML file, at its position. It prints as
// file[:line[:column]]: [path: ]message, one line whatever the file name
// holds.
type Error struct {
	// File names the input ("budgets.yaml", "<stdin>").
	File string
	// Line is 1-based; 0 when the problem is not tied to a line (an empty
	// or unreadable file, a duplicate domain across files).
	Line int
	// Column is 1-based; 0 when unknown or not reported.
	Column int
	// Path is the field path ("spec.budgets[3].tokensPerDay"), "" for none.
	Path string
	// Msg says what is wrong; when empty, Err does.
	Msg string
	// Err is the cause, for errors.Is (ErrSyntax, ErrTooDeep, ...); nil for
	// a problem the message says all of.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(safetext.Inline(e.File))
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
		if e.Column > 0 {
			b.WriteString(":" + strconv.Itoa(e.Column))
		}
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path + ": ")
	}
	switch {
	case e.Msg != "" && e.Err != nil:
		b.WriteString(e.Msg + ": " + e.Err.Error())
	case e.Msg != "":
		b.WriteString(e.Msg)
	case e.Err != nil:
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// List is every problem found in an input. Loaders return it, sorted, as
// their error when it is not empty (see Err).
type List []*Error

// Error prints one problem per line.
func (l List) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Unwrap exposes each Error to errors.As and errors.Is.
func (l List) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// Sort orders the problems by file, line, column, then path, keeping the
// order of equal ones.
func (l List) Sort() {
	slices.SortStableFunc(l, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line),
			cmp.Compare(a.Column, b.Column), cmp.Compare(a.Path, b.Path))
	})
}

// Err returns the sorted list as an error, or nil when it is empty (a nil
// List stored in an error would not compare equal to nil).
func (l List) Err() error {
	if len(l) == 0 {
		return nil
	}
	l.Sort()
	return l
}
