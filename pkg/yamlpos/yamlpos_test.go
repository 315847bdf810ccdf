package yamlpos

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func TestErrorFormat(t *testing.T) {
	cases := []struct {
		e    Error
		want string
	}{
		{Error{File: "f.yaml", Line: 3, Column: 5, Path: "a.b", Msg: "bad"}, "f.yaml:3:5: a.b: bad"},
		{Error{File: "f.yaml", Line: 3, Path: "a.b", Msg: "bad"}, "f.yaml:3: a.b: bad"},
		{Error{File: "f.yaml", Column: 5, Msg: "bad"}, "f.yaml: bad"}, // a column without a line says nothing
		{Error{File: "f.yaml", Line: 2, Err: ErrSyntax}, "f.yaml:2: invalid YAML"},
		{Error{File: "f.yaml", Msg: "read", Err: io.ErrUnexpectedEOF}, "f.yaml: read: unexpected EOF"},
		{Error{File: "a\n::error::x.yaml", Line: 1, Msg: "m"}, `a\n::error::x.yaml:1: m`},
	}
	for _, c := range cases {
		if got := c.e.Error(); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
}

func TestListSortsAndUnwraps(t *testing.T) {
	l := List{
		{File: "f", Line: 4, Path: "b", Msg: "x"},
		{File: "f", Line: 2, Column: 9, Path: "a", Msg: "y"},
		{File: "f", Line: 2, Column: 1, Path: "z", Err: ErrTooDeep},
	}
	err := l.Err()
	if got, want := err.Error(), "f:2:1: z: document nested too deeply\nf:2:9: a: y\nf:4: b: x"; got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if !errors.Is(err, ErrTooDeep) {
		t.Error("errors.Is does not reach an item's cause")
	}
	var e *Error
	if !errors.As(err, &e) || e.Line != 2 {
		t.Errorf("errors.As = %v", e)
	}
	if (List{}).Err() != nil || List(nil).Err() != nil {
		t.Error("an empty list is an error")
	}
}

func TestPositionsOf(t *testing.T) {
	p := Positions{"": {1, 1}, "spec": {2, 1}, "spec.budgets[0]": {4, 7}}
	for path, want := range map[string]Pos{
		"spec.budgets[0]":           {4, 7},
		"spec.budgets[0].mode":      {4, 7}, // absent: its parent
		"spec.budgets[3].name":      {2, 1},
		"metadata.name":             {1, 1},
		"":                          {1, 1},
		"spec.budgets[0].limits[2]": {4, 7},
	} {
		if got := p.Of(path); got != want {
			t.Errorf("Of(%q) = %v, want %v", path, got, want)
		}
	}
	if got := Positions(nil).Of("a.b"); got != (Pos{}) {
		t.Errorf("nil positions: %v", got)
	}
}

// yaml.v3's syntax errors carry their line in the text only; the reader
// moves it into the position and keeps the problem as the message.
func TestSyntaxErrorsArePositioned(t *testing.T) {
	cases := []struct {
		src, want string
	}{
		{"a: [\n", "f.yaml:1: invalid YAML: did not find expected node content"},
		{"a: b\n  c: d\n", "f.yaml:2: invalid YAML: mapping values are not allowed in this context"},
		{"a: *nope\n", "f.yaml: invalid YAML: unknown anchor 'nope' referenced"},
		{"a: 1\n---\nb: [\n", "f.yaml:3: invalid YAML: did not find expected node content"},
		// What to do, where yaml.v3's words do not say it.
		{"a:\n  b: 1\n\tc: 2\n", "f.yaml:3: invalid YAML: found a tab character that violates indentation: YAML indents with spaces"},
		{"a:\n  - b: 1   # c\n\td: 3\n", "f.yaml:3: invalid YAML: found character that cannot start any token (the line holds a tab: YAML indents with spaces)"},
		{"a: \xff\xfe\x00\x01", "f.yaml: invalid YAML: invalid leading UTF-8 octet (the file is not UTF-8 text: is it the right file?)"},
		{"a: b\x01\n", "f.yaml: invalid YAML: control characters are not allowed (the file is not UTF-8 text: is it the right file?)"},
		// UTF-16 (found by FuzzRead): yaml.v3 decodes it, but its line 2
		// was not the file's.
		{"\xfe\xff (0000", "f.yaml:1: invalid YAML: the file is UTF-16 (it starts with the byte order mark FE FF); save it as UTF-8"},
		{"\xff\xfea\x00:\x00 \x001\x00\n\x00", "f.yaml:1: invalid YAML: the file is UTF-16 (it starts with the byte order mark FF FE); save it as UTF-8"},
	}
	for _, c := range cases {
		r := NewReader([]byte(c.src), Options{File: "f.yaml"})
		var err error
		for err == nil {
			_, err = r.Next()
		}
		if err.Error() != c.want || !errors.Is(err, ErrSyntax) {
			t.Errorf("%q: got %v, want %s", c.src, err, c.want)
		}
		if _, again := r.Next(); again != err {
			t.Errorf("%q: the error is not sticky: %v", c.src, again)
		}
	}
}

func TestSplitLine(t *testing.T) {
	cases := []struct {
		text string
		line int
		msg  string
	}{
		{"yaml: line 12: found a tab", 12, "found a tab"},
		{"yaml: unknown anchor 'x' referenced", 0, "unknown anchor 'x' referenced"},
		{"yaml: line 0: x", 0, "line 0: x"},
		{"yaml: line 07: x", 0, "line 07: x"},
		{"yaml: line -3: x", 0, "line -3: x"},
		{"yaml: line +3: x", 0, "line +3: x"},
		{"yaml: line 99999999999999999999: x", 0, "line 99999999999999999999: x"},
		{"yaml: line 7:", 0, "line 7:"},
		{"line 4: no prefix", 4, "no prefix"},
		{"", 0, ""},
	}
	for _, c := range cases {
		line, msg := splitLine(c.text)
		if line != c.line || msg != c.msg {
			t.Errorf("splitLine(%q) = %d, %q; want %d, %q", c.text, line, msg, c.line, c.msg)
		}
	}
}

// FuzzSplitLine: any text splits without a panic; a line is only ever read
// from a "line N: " prefix, and a well-formed text gives back its parts.
func FuzzSplitLine(f *testing.F) {
	f.Add("yaml: line 3: did not find expected key", uint32(3), "x")
	f.Add("yaml: line : x", uint32(1), "")
	f.Add("line 1:2: x", uint32(0), "a: b")
	f.Fuzz(func(t *testing.T, text string, n uint32, msg string) {
		line, rest := splitLine(text)
		if line < 0 || (line > 0 && !strings.Contains(text, fmt.Sprintf("line %d: ", line))) {
			t.Fatalf("splitLine(%q) = %d: a line the text does not hold", text, line)
		}
		if line == 0 && rest != strings.TrimPrefix(text, "yaml: ") {
			t.Fatalf("splitLine(%q) dropped text without a line: %q", text, rest)
		}
		if n == 0 || n > 999_999_999 {
			return
		}
		line, rest = splitLine(fmt.Sprintf("yaml: line %d: %s", n, msg))
		if line != int(n) || rest != msg {
			t.Fatalf("line %d %q: got %d %q", n, msg, line, rest)
		}
	})
}

func TestOne(t *testing.T) {
	opts := Options{File: "b.yaml", LinesOnly: true}
	cases := []struct{ src, want string }{
		{"", "b.yaml: empty document: expected a BudgetSet"},
		{"# only a comment\n", "b.yaml: empty document: expected a BudgetSet"},
		{"a: 1\n---\nb: 2\n", "b.yaml:2: more than one YAML document: a spec file holds exactly one BudgetSet"},
		{"a: 1\n---\nb: [\n", "b.yaml:3: invalid YAML: did not find expected node content"},
		{"a: &a [*a]\n", "b.yaml:1: document refers to itself through an alias: *a"},
	}
	for _, c := range cases {
		root, err := One([]byte(c.src), opts, "BudgetSet", "spec file")
		if err == nil || root != nil || err.Error() != c.want {
			t.Errorf("%q: got %v, %v; want %s", c.src, root, err, c.want)
		}
	}
	root, err := One([]byte("---\na: 1\n"), opts, "BudgetSet", "spec file")
	if err != nil || root.Kind != yaml.MappingNode || root.Line != 2 {
		t.Errorf("one document: %v, %v", root, err)
	}
}

// billionLaughs is the classic alias bomb: 9^9 leaves from ~1 KB of YAML.
func billionLaughs() string {
	var b strings.Builder
	b.WriteString("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n")
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
		fmt.Fprintf(&b, "%s: &%s [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n", n, n, prev, prev, prev, prev, prev, prev, prev, prev, prev)
		prev = n
	}
	return b.String()
}

func TestReaderBounds(t *testing.T) {
	cases := []struct {
		src  string
		opts Options
		want error
	}{
		{billionLaughs(), Options{}, ErrAliasBomb},
		{"a: &a [x, x]\nb: [*a, *a, *a]\n", Options{MaxNodes: 8}, ErrAliasBomb},
		{"a: " + strings.Repeat("[", 300) + strings.Repeat("]", 300) + "\n", Options{}, ErrTooDeep},
		{"a: [[[1]]]\n", Options{MaxDepth: 3}, ErrTooDeep},
		{"a: &a {b: *a}\n", Options{}, ErrAliasCycle},
	}
	for _, c := range cases {
		c.opts.File = "f.yaml"
		_, err := NewReader([]byte(c.src), c.opts).Next()
		var e *Error
		if !errors.Is(err, c.want) || !errors.As(err, &e) || e.File != "f.yaml" || e.Line != 1 {
			t.Errorf("%.40q: got %v, want %v at f.yaml:1", c.src, err, c.want)
		}
	}
	if _, err := NewReader([]byte("a: &a [x, x]\nb: [*a, *a, *a]\n"), Options{MaxNodes: 20}).Next(); err != nil {
		t.Errorf("within bounds: %v", err)
	}
}

// FuzzRead: any input reads document by document and decodes without a
// panic; every error is an *Error naming the file, within the input's lines.
func FuzzRead(f *testing.F) {
	f.Add([]byte("a: 1\n---\nb: [x, y]\n"))
	f.Add([]byte(billionLaughs()))
	f.Add([]byte("a: &a [*a]\n"))
	f.Add([]byte("- [\n"))
	f.Add([]byte("name: x\nlist: [{n: 1, b: true}, {n: -1}]\nmap: {k: v, k: w}\n"))
	f.Add([]byte("\t- x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		lines := MaxLine(data)
		check := func(err error) {
			var e *Error
			if !errors.As(err, &e) || e.File != "fuzz.yaml" || e.Line < 0 || e.Line > lines {
				t.Fatalf("error without its place: %v", err)
			}
		}
		opts := Options{File: "fuzz.yaml", MaxNodes: 10_000}
		r := NewReader(data, opts)
		for range 100 {
			doc, err := r.Next()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				check(err)
				return
			}
			if len(doc.Content) == 0 {
				continue
			}
			var v sample
			if _, errs := Decode(doc.Content[0], &v, opts); len(errs) > 0 {
				check(errs.Err())
			}
		}
	})
}

// MaxLine is the most lines YAML can see in data: one more than its line
// breaks, which are \n, \r, NEL, LS and PS (\r\n counted twice).
func MaxLine(data []byte) int {
	s := string(data)
	n := 1
	for _, br := range []string{"\n", "\r", "\u0085", "\u2028", "\u2029"} {
		n += strings.Count(s, br)
	}
	return n
}

type sample struct {
	Name string         `json:"name"`
	List []sampleItem   `json:"list"`
	Map  map[string]any `json:"-"`
	Kv   map[string]string
}

type sampleItem struct {
	N int8  `json:"n"`
	B *bool `json:"b"`
	U uint  `json:"u"`
}
