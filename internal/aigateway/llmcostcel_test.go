package aigateway

import (
	"reflect"
	"strconv"
	"testing"
)

// ModelPatterns reads back the patterns an expression matches model names
// against, quoted as strconv.Quote writes them (pkg/render's expressions).
func TestModelPatterns(t *testing.T) {
	pats := []string{`^(?:gpt-5.*)$`, `^(?:a"b\c)$`, `^(?:é|x)$`}
	expr := ""
	for _, p := range pats {
		expr += "model.matches(" + strconv.Quote(p) + ") ? 1u : "
	}
	expr += "2u"
	got, ok := ModelPatterns(expr)
	if !ok || !reflect.DeepEqual(got, pats) {
		t.Fatalf("patterns %q %v, want %q", got, ok, pats)
	}
	if got, ok := ModelPatterns("input_tokens + 1u"); !ok || got != nil {
		t.Fatalf("no patterns: %q %v", got, ok)
	}
}

// FuzzModelPatterns: any expression is read without panic, and a pattern
// quoted into a model.matches call reads back as itself.
func FuzzModelPatterns(f *testing.F) {
	f.Add(`model.matches("^(?:gpt-5.*)$") ? 1u : 2u`, "x")
	f.Add(`model.matches("\"") ? 1u : 2u`, `a"b`)
	f.Fuzz(func(t *testing.T, expr, pattern string) {
		_, _ = ModelPatterns(expr)
		got, ok := ModelPatterns("model.matches(" + strconv.Quote(pattern) + ")")
		if !ok || len(got) != 1 || got[0] != pattern {
			t.Fatalf("%q read back as %q %v", pattern, got, ok)
		}
	})
}
