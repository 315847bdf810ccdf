// Package safetext makes values that come from input (file names, object
// names, principals, messages quoting YAML) safe to print on one line of a
// terminal or a CI log. A CI runner interprets some lines of a step's output:
// GitHub Actions runs any line that starts, after blanks, with "::" as a
// workflow command, so a file name holding "\n::error ...::" would forge an
// annotation, and terminal escape sequences could rewrite what a reviewer
// sees. Escaping is for safety and readability, not reversible.
package safetext

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Inline escapes s for use inside one line: every control character (C0,
// DEL, C1, including newline, carriage return and escape), Unicode
// bidirectional controls and line or paragraph separators become Go-style
// escapes (\n, \r, \t, \x1b, \u202e), and invalid UTF-8 bytes become \xNN.
// Printable text, including non-ASCII letters, is kept.
func Inline(s string) string { return escape(s, false) }

// Line escapes s like Inline, keeping tabs (column layouts), and makes sure
// the result cannot be read as a workflow command: a line that starts, after
// blanks, with "::" gets its first colon escaped as \x3a.
func Line(s string) string { return noCommand(escape(s, true)) }

func escape(s string, keepTab bool) string {
	if !needsEscape(s, keepTab) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t' && keepTab:
			b.WriteByte('\t')
		case r == '\t':
			b.WriteString(`\t`)
		case unsafeRune(r):
			if r < 0x100 {
				fmt.Fprintf(&b, `\x%02x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// Lines escapes every line of a multi-line text (a diff, a detail block):
// newlines stay line breaks, each line is escaped by Line.
func Lines(s string) string {
	parts := strings.Split(s, "\n")
	for i, p := range parts {
		parts[i] = Line(p)
	}
	return strings.Join(parts, "\n")
}

// Multiline escapes like Lines but leaves lines that start with "::" alone:
// for text that travels inside one workflow command's encoded data, where
// its line breaks are data, not log lines.
func Multiline(s string) string {
	parts := strings.Split(s, "\n")
	for i, p := range parts {
		parts[i] = escape(p, true)
	}
	return strings.Join(parts, "\n")
}

func noCommand(s string) string {
	trimmed := strings.TrimLeft(s, " \t")
	if strings.HasPrefix(trimmed, "::") {
		lead := len(s) - len(trimmed)
		return s[:lead] + `\x3a` + trimmed[1:]
	}
	return s
}

func needsEscape(s string, keepTab bool) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || (unsafeRune(r) && (!keepTab || r != '\t')) {
			return true
		}
		i += size
	}
	return false
}

func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) ||
		r == '\u2028' || r == '\u2029' || r == '\ufeff'
}
