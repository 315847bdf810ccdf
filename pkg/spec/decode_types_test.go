package spec

import (
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestDecoderLoadsEveryFieldType builds a document setting every field of
// the BudgetSet types (one element per list, one key per map) and decodes
// it: a field whose Go type the decoder cannot fill (an int32 port once
// was) fails here, not in a user's render.
func TestDecoderLoadsEveryFieldType(t *testing.T) {
	kinds := map[reflect.Kind]bool{}
	root := sampleNode(reflect.TypeOf(BudgetSet{}), kinds, map[reflect.Type]bool{})
	var errs ErrorList
	bs := &BudgetSet{}
	d := &decoder{pos: map[string]int{}, errs: &errs, file: "every-field.yaml"}
	d.decode(root, reflect.ValueOf(bs).Elem(), "")
	if len(errs) > 0 {
		out, _ := yaml.Marshal(root)
		t.Fatalf("decode of every field failed:\n%v\ndocument:\n%s", errs, out)
	}
	if bs.Spec.RateLimitService.Port != 1 {
		t.Errorf("spec.rateLimitService.port = %d, want 1", bs.Spec.RateLimitService.Port)
	}
	for _, k := range []reflect.Kind{reflect.String, reflect.Bool, reflect.Int64, reflect.Int32} {
		if !kinds[k] {
			t.Errorf("the walk found no %s field: the test no longer covers it", k)
		}
	}
}

// sampleNode returns a YAML node holding a valid-typed value for t.
func sampleNode(t reflect.Type, kinds map[reflect.Kind]bool, seen map[reflect.Type]bool) *yaml.Node {
	kinds[t.Kind()] = true
	scalar := func(tag, v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v} }
	switch t.Kind() {
	case reflect.Pointer:
		return sampleNode(t.Elem(), kinds, seen)
	case reflect.Struct:
		if seen[t] {
			return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		}
		seen[t] = true
		defer delete(seen, t)
		m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for _, f := range fieldsOf(t) {
			m.Content = append(m.Content, scalar("!!str", f.name), sampleNode(t.FieldByIndex(f.index).Type, kinds, seen))
		}
		return m
	case reflect.Slice:
		return &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Content: []*yaml.Node{sampleNode(t.Elem(), kinds, seen)}}
	case reflect.Map:
		return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: []*yaml.Node{scalar("!!str", "k"), sampleNode(t.Elem(), kinds, seen)}}
	case reflect.String:
		return scalar("!!str", "x")
	case reflect.Bool:
		return scalar("!!bool", "true")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return scalar("!!int", "1")
	}
	// A kind the walk cannot sample (float, interface): a string makes the
	// decoder say whether it supports it.
	return scalar("!!str", strings.ToLower(t.Kind().String()))
}

// Integers of every width are range-checked against their own type.
func TestDecoderIntRanges(t *testing.T) {
	cases := []struct {
		yaml string
		into any
		want string
	}{
		{"65535", new(int32), ""},
		{"2147483648", new(int32), "between -2147483648 and 2147483647"},
		{"-1", new(uint16), "between 0 and 65535"},
		{"4294967295", new(uint32), ""},
		{"9223372036854775807", new(int64), ""},
		{"1.5", new(int32), "must be an integer"},
	}
	for _, c := range cases {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(c.yaml), &n); err != nil {
			t.Fatal(err)
		}
		var errs ErrorList
		d := &decoder{pos: map[string]int{}, errs: &errs, file: "f"}
		d.decode(n.Content[0], reflect.ValueOf(c.into).Elem(), "x")
		got := ""
		if len(errs) > 0 {
			got = errs.Error()
		}
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s into %T: errors %q, want %q", c.yaml, c.into, got, c.want)
		}
	}
}

// The port loads from a real spec (it failed with "unsupported field type int32").
func TestLoadRateLimitServicePort(t *testing.T) {
	bs, err := Load([]byte(base+"  rateLimitService: {namespace: budgetgen, name: budgetgen-ratelimit, port: 8081}\n"), "budgets.yaml")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if rs := bs.Spec.RateLimitService; rs.Port != 8081 || rs.Name != "budgetgen-ratelimit" {
		t.Errorf("rateLimitService = %+v", rs)
	}
}
