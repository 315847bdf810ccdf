package spec

import (
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// TestDecoderLoadsEveryFieldType builds a document setting every field of
// the BudgetSet types (one element per list, one key per map) and decodes
// it: a field whose Go type the decoder cannot fill (an int32 port once
// was) fails here, not in a user's render.
func TestDecoderLoadsEveryFieldType(t *testing.T) {
	kinds := map[reflect.Kind]bool{}
	root := sampleNode(reflect.TypeOf(BudgetSet{}), kinds, map[reflect.Type]bool{})
	bs := &BudgetSet{}
	if _, errs := yamlpos.Decode(root, bs, yamlpos.Options{File: "every-field.yaml"}); len(errs) > 0 {
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
		for _, f := range jsonFields(t) {
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

type jsonField struct {
	name  string
	index []int
}

// jsonFields lists the fields a document of t may set, by json tag, with
// embedded structs flattened (as the decoder names them).
func jsonFields(t reflect.Type) []jsonField {
	var out []jsonField
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case !f.IsExported() || name == "-":
		case f.Anonymous && name == "":
			for _, sub := range jsonFields(f.Type) {
				out = append(out, jsonField{sub.name, append([]int{i}, sub.index...)})
			}
		case name == "":
			out = append(out, jsonField{f.Name, []int{i}})
		default:
			out = append(out, jsonField{name, []int{i}})
		}
	}
	return out
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
