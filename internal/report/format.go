package report

import (
	"fmt"
	"io"
	"strings"
)

// Format names for --format.
const (
	FormatText     = "text"
	FormatJSON     = "json"
	FormatMarkdown = "markdown"
	FormatHTML     = "html"
)

// Formats lists the format names, for the flag's help.
var Formats = []string{FormatText, FormatJSON, FormatMarkdown, FormatHTML}

// Writer writes a whole report in one format.
type Writer func(w io.Writer, r *Report) error

// WriterFor returns the writer of a format, or an error naming the known ones
// (an unknown format never falls back to text).
func WriterFor(format string) (Writer, error) {
	switch format {
	case FormatText:
		return WriteText, nil
	case FormatJSON:
		return WriteJSON, nil
	case FormatMarkdown:
		return WriteMarkdown, nil
	case FormatHTML:
		return WriteHTML, nil
	}
	return nil, fmt.Errorf("unknown format %q (known: %s)", format, strings.Join(Formats, ", "))
}

// group formats n with thousands separators: 5000000 -> 5,000,000.
func group(n uint64) string {
	s := fmt.Sprintf("%d", n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func pct(f float64) string { return fmt.Sprintf("%.2f%%", f*100) }

// amount formats a number of a budget: tokens, or money in 1/10,000 units.
func (b *Budget) amount(v uint64) string {
	if b.Currency == "" {
		return group(v)
	}
	return fmt.Sprintf("%s %s.%04d", b.Currency, group(v/10000), v%10000)
}

// capOf is a budget's cap as text ("unknown" when 0).
func (b *Budget) capOf() string {
	if b.Cap == 0 || b.Currency == "" {
		return capText(b.Cap)
	}
	return b.amount(b.Cap)
}

func capText(c uint64) string {
	if c == 0 {
		return "unknown"
	}
	return group(c)
}
