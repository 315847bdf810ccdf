package safetext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestInlineAndLine(t *testing.T) {
	for _, c := range []struct{ in, inline, line string }{
		{"plain/file.yaml", "plain/file.yaml", "plain/file.yaml"},
		{"a\n::error file=x::forged", `a\n::error file=x::forged`, `a\n::error file=x::forged`},
		{"::error::x", "::error::x", `\x3a:error::x`},
		{"  \t::warning::x", `  \t::warning::x`, "  \t\\x3a:warning::x"},
		{"red\x1b[31m\r", `red\x1b[31m\r`, `red\x1b[31m\r`},
		{"tab\there", `tab\there`, "tab\there"},
		{"bidi\u202eevil", `bidi\u202eevil`, `bidi\u202eevil`},
		{"bad\xffbyte", `bad\xffbyte`, `bad\xffbyte`},
		{"ünïcode 名前", "ünïcode 名前", "ünïcode 名前"},
		{"del\x7f nel\u0085", `del\x7f nel\x85`, `del\x7f nel\x85`},
	} {
		if got := Inline(c.in); got != c.inline {
			t.Errorf("Inline(%q) = %q, want %q", c.in, got, c.inline)
		}
		if got := Line(c.in); got != c.line {
			t.Errorf("Line(%q) = %q, want %q", c.in, got, c.line)
		}
	}
	if got := Lines("ok\n::error::x\n  ::debug::y\r"); got != "ok\n\\x3a:error::x\n  \\x3a:debug::y\\r" {
		t.Errorf("Lines = %q", got)
	}
}

// FuzzLines: whatever the input, the output holds no control character but
// newline and tab, is valid UTF-8, and no line of it is a workflow command.
func FuzzLines(f *testing.F) {
	for _, s := range []string{"", "a\n::error::b", "\x1b]8;;x\x07", "\r\n::set-output name=x::y", "\u2028::x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, out := range []string{Lines(s), Line(s), Inline(s)} {
			if !utf8.ValidString(out) {
				t.Fatalf("invalid UTF-8: %q", out)
			}
			for _, r := range out {
				if r != '\n' && r != '\t' && unsafeRune(r) {
					t.Fatalf("unsafe rune %U in %q", r, out)
				}
			}
		}
		if strings.Contains(Line(s), "\n") || strings.Contains(Inline(s), "\n") || strings.Contains(Inline(s), "\t") {
			t.Fatalf("line break left in %q", Line(s))
		}
		for _, l := range strings.Split(Lines(s), "\n") {
			if strings.HasPrefix(strings.TrimLeft(l, " \t"), "::") {
				t.Fatalf("workflow command survives: %q", l)
			}
		}
	})
}
