package spec

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// maxNodes bounds how many YAML nodes one decode visits, so aliases cannot
// expand a small file into an enormous walk ("billion laughs").
const maxNodes = 1_000_000

// decoder fills Go values from yaml.v3 nodes by their json tags, remembering
// the source line of every field path and collecting every error with its
// position instead of stopping at the first.
type decoder struct {
	pos    map[string]int
	errs   *ErrorList
	file   string
	visits int
}

func (d *decoder) fail(line int, path, format string, args ...any) {
	d.errs.add(d.file, line, path, fmt.Sprintf(format, args...))
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// field describes one settable struct field, with embedded structs flattened.
type field struct {
	name  string
	index []int
}

func fieldsOf(t reflect.Type) []field {
	var out []field
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			for _, sub := range fieldsOf(f.Type) {
				out = append(out, field{name: sub.name, index: append([]int{i}, sub.index...)})
			}
			continue
		}
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, field{name: name, index: []int{i}})
	}
	return out
}

func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	d.visits++
	if d.visits > maxNodes {
		if d.visits == maxNodes+1 {
			d.fail(n.Line, path, "document too large (more than %d YAML nodes after alias expansion)", maxNodes)
		}
		return
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			d.fail(n.Line, path, "unresolved alias")
			return
		}
		d.decode(n.Alias, v, path)
		return
	}
	d.pos[path] = n.Line
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		// An explicit null leaves the zero value, like an absent field.
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.decode(n, v.Elem(), path)
	case reflect.Struct:
		d.decodeStruct(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n.Line, path, "must be a list, got %s", describe(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			d.decode(item, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.fail(n.Line, path, "must be a mapping, got %s", describe(n))
			return
		}
		m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				d.fail(k.Line, path, "keys must be strings, got %s", describe(k))
				continue
			}
			p := join(path, k.Value)
			if first, dup := seen[k.Value]; dup {
				d.fail(k.Line, p, "duplicate key (first at line %d)", first)
				continue
			}
			seen[k.Value] = k.Line
			elem := reflect.New(v.Type().Elem()).Elem()
			d.decode(val, elem, p)
			m.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), elem)
		}
		v.Set(m)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.fail(n.Line, path, "must be a string, got %s", describe(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			d.fail(n.Line, path, "must be true or false, got %s", describe(n))
			return
		}
		var b bool
		if err := n.Decode(&b); err != nil {
			d.fail(n.Line, path, "must be true or false, got %q", n.Value)
			return
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		d.decodeInt(n, v, path)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		d.decodeUint(n, v, path)
	default:
		d.fail(n.Line, path, "unsupported field type %s", v.Type())
	}
}

// decodeInt fills a signed integer of any width; a value the field's type
// cannot hold is an error naming the type's range, never a silent wrap.
func (d *decoder) decodeInt(n *yaml.Node, v reflect.Value, path string) {
	bits := v.Type().Bits()
	lo, hi := int64(-1)<<(bits-1), int64(uint64(1)<<(bits-1)-1)
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		d.fail(n.Line, path, "must be an integer, got %s", describe(n))
		return
	}
	i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
	if err != nil || v.OverflowInt(i) {
		d.fail(n.Line, path, "must be an integer between %d and %d, got %q", lo, hi, n.Value)
		return
	}
	v.SetInt(i)
}

// decodeUint fills an unsigned integer of any width.
func (d *decoder) decodeUint(n *yaml.Node, v reflect.Value, path string) {
	hi := uint64(math.MaxUint64) >> (64 - v.Type().Bits())
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		d.fail(n.Line, path, "must be an integer, got %s", describe(n))
		return
	}
	u, err := strconv.ParseUint(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
	if err != nil || v.OverflowUint(u) {
		d.fail(n.Line, path, "must be an integer between 0 and %d, got %q", hi, n.Value)
		return
	}
	v.SetUint(u)
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(n.Line, path, "must be a mapping, got %s", describe(n))
		return
	}
	fields := fieldsOf(v.Type())
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.fail(k.Line, path, "keys must be strings, got %s", describe(k))
			continue
		}
		p := join(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			d.fail(k.Line, p, "duplicate field (first at line %d)", first)
			continue
		}
		seen[k.Value] = k.Line
		var f *field
		for j := range fields {
			if fields[j].name == k.Value {
				f = &fields[j]
				break
			}
		}
		if f == nil {
			d.fail(k.Line, p, "unknown field (known: %s)", knownNames(fields))
			continue
		}
		d.decode(val, v.FieldByIndex(f.index), p)
	}
}

func knownNames(fs []field) string {
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.name
	}
	return strings.Join(names, ", ")
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "nothing"
}
