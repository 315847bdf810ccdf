package yamlpos

import (
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func parse(t *testing.T, src string) *yaml.Node {
	t.Helper()
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(src), &n); err != nil {
		t.Fatal(err)
	}
	return n.Content[0]
}

// Integers of every width are range-checked against their own type.
func TestDecodeIntRanges(t *testing.T) {
	cases := []struct {
		yaml string
		into any
		want string
	}{
		{"65535", new(int32), ""},
		{"2147483648", new(int32), "between -2147483648 and 2147483647"},
		{"-1", new(uint16), "between 0 and 65535"},
		{"4294967295", new(uint32), ""},
		{"1_000", new(uint32), ""},
		{"0x10", new(int8), ""},
		{"9223372036854775807", new(int64), ""},
		{"1.5", new(int32), `must be an integer, got "1.5" (a float)`},
		{`"5"`, new(uint32), `must be a non-negative integer, got "5"`},
		{"true", new(int), `must be an integer, got "true" (a boolean)`},
	}
	for _, c := range cases {
		_, errs := Decode(parse(t, c.yaml), c.into, Options{File: "f"})
		got := ""
		if len(errs) > 0 {
			got = errs.Error()
		}
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s into %T: errors %q, want %q", c.yaml, c.into, got, c.want)
		}
	}
}

type doc struct {
	Name   string            `yaml:"name"`
	On     bool              `yaml:"on"`
	Items  []item            `yaml:"items"`
	Labels map[string]string `yaml:"labels"`
	Sub    *item             `yaml:"sub"`
	Skip   string            `yaml:"-"`
	inner
}

type inner struct {
	Flat string `yaml:"flat"`
}

type item struct {
	N int `yaml:"n"`
}

// Every problem is reported, in line order, each where it is; what decodes
// is kept, and every field path's position is recorded.
func TestDecodeReportsEveryProblem(t *testing.T) {
	src := `name: [x]
on: yes
items:
  - n: 1
  - {n: two, m: 3}
labels: {a: b, a: c}
labels: {}
Skip: x
flat: f
sub: ~
`
	var d doc
	pos, errs := Decode(parse(t, src), &d, Options{File: "d.yaml", Tag: "yaml"})
	want := []string{
		`d.yaml:1:7: name: must be a string, got a list`,
		`d.yaml:2:5: on: must be true or false, got "yes"`,
		`d.yaml:5:9: items[1].n: must be an integer, got "two"`,
		`d.yaml:5:14: items[1].m: unknown field (known: n)`,
		`d.yaml:6:16: labels.a: duplicate key (first at line 6)`,
		`d.yaml:7:1: labels: duplicate field (first at line 6)`,
		`d.yaml:8:1: Skip: unknown field (known: name, on, items, labels, sub, flat)`,
	}
	if got := errs.Error(); got != strings.Join(want, "\n") {
		t.Errorf("errors:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	if d.Items[0].N != 1 || d.Labels["a"] != "b" || d.Flat != "f" || d.Sub != nil {
		t.Errorf("decoded %+v", d)
	}
	if pos["items[1].n"] != (Pos{5, 9}) || pos["flat"] != (Pos{9, 7}) || pos[""] != (Pos{1, 1}) {
		t.Errorf("positions %v", pos)
	}
}

func TestDecodeOptions(t *testing.T) {
	type text struct {
		V string `json:"v"`
	}
	cases := []struct {
		name, src string
		opts      Options
		want      string
	}{
		{"any scalar is text", "v: 1.5", Options{}, ""},
		{"string tags", "v: 1.5", Options{StringTags: []string{"!!int", "!!bool"}}, `f:1:4: v: must be a string, got "1.5" (a float)`},
		{"string tags allow", "v: 15", Options{StringTags: []string{"!!int", "!!bool"}}, ""},
		{"aliases followed", "a: &a x\nv: *a", Options{Unknown: accept}, ""},
		{"no aliases", "a: &a x\nv: *a", Options{Unknown: accept, NoAliases: true}, "f:2:4: v: aliases are not supported"},
		{"lines only", "v: [1]", Options{LinesOnly: true}, "f:1: v: must be a string, got a list"},
		{"unknown refused", "w: 1", Options{Unknown: func(k, _ *yaml.Node, p string) *Error {
			return Options{File: "f"}.Errorf(k, p, "no %s here", k.Value)
		}}, "f:1:1: w: no w here"},
		{"top level", "- v", Options{}, "f:1:1: the top level must be a mapping, got a list"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.opts.File = "f"
			var v text
			_, errs := Decode(parse(t, c.src), &v, c.opts)
			if got := errs.Error(); got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

func accept(_, _ *yaml.Node, _ string) *Error { return nil }

func TestDecodeNeedsAPointer(t *testing.T) {
	var d doc
	if _, errs := Decode(parse(t, "name: x"), d, Options{}); len(errs) != 1 {
		t.Errorf("decode into a value: %v", errs)
	}
	if pos, errs := Decode(nil, &d, Options{}); len(errs) != 0 || len(pos) != 0 || !reflect.DeepEqual(d, doc{}) {
		t.Errorf("decode of nothing: %v %v %+v", pos, errs, d)
	}
}

// TestNearestField: a misspelt key names the field it most likely meant;
// a key far from every field, or as close to two, names none.
func TestNearestField(t *testing.T) {
	fs := []field{{name: "tokensPerDay"}, {name: "tokensPerWeek"}, {name: "name"}, {name: "mode"}, {name: "reserve"}, {name: "reserved"}, {name: "reserveInitial"}}
	for _, c := range []struct{ key, want string }{
		{"tokensPerDy", "tokensPerDay"},
		{"TokensPerDay", "tokensPerDay"},
		{"nmae", "name"},
		{"reserveInital", "reserveInitial"},
		{"reserv", "reserve"},
		{"node", "mode"},
		{"tokensPer", "tokensPerDay"}, // 3 edits, tokensPerWeek 4
		{"reservex", ""},              // as close to reserve as to reserved
		{"m", ""},                     // a one-letter key is one edit from anything
		{"budgets", ""},               // far from every field
		{"xyzzy12345", ""},
	} {
		if got := nearest(c.key, fs); got != c.want {
			t.Errorf("nearest(%q) = %q, want %q", c.key, got, c.want)
		}
	}
}
