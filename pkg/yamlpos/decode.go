package yamlpos

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Decode fills the value v points to from root, naming struct fields by
// Options.Tag, and returns where the value of every field path is and every
// problem found, sorted (nil when none). It goes on past a problem, so one
// run reports them all.
//
// A struct refuses keys no field has (unless Options.Unknown accepts them)
// and repeated keys; an explicit null leaves the zero value, like an absent
// field; an integer must fit its field's type; a bool is true or false.
// Aliases are followed (Options.NoAliases refuses them) within the bounds
// of Options, checked on root first.
func Decode(root *yaml.Node, v any, opts Options) (Positions, List) {
	opts = opts.withDefaults()
	d := &decoder{opts: opts, pos: Positions{}}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return d.pos, List{opts.errorAt(Pos{}, "", fmt.Sprintf("decode into %T: want a non-nil pointer", v), nil)}
	}
	if root == nil {
		return d.pos, nil
	}
	if err := checkSize(root, opts); err != nil {
		return d.pos, List{opts.errorAt(At(root), "", "", err)}
	}
	d.decode(root, rv.Elem(), "")
	d.errs.Sort()
	return d.pos, d.errs
}

type decoder struct {
	opts Options
	pos  Positions
	errs List
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	d.errs = append(d.errs, d.opts.Errorf(n, path, format, args...))
}

// mismatch reports a value of the wrong kind: "must be <want>, got <what>".
func (d *decoder) mismatch(n *yaml.Node, path, want string) {
	msg := "must be " + want + ", got " + describe(n)
	if path == "" {
		msg = "the top level " + msg
	}
	d.fail(n, path, "%s", msg)
}

func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	d.pos[path] = At(n)
	if n.Kind == yaml.AliasNode {
		if d.opts.NoAliases {
			d.fail(n, path, "aliases are not supported")
			return
		}
		n = n.Alias // never nil: checkSize refused an alias without anchor
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // an explicit null leaves the zero value, like an absent field
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
		d.decodeSlice(n, v, path)
	case reflect.Map:
		d.decodeMap(n, v, path)
	default:
		d.decodeScalar(n, v, path)
	}
}

func (d *decoder) decodeSlice(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.SequenceNode {
		d.mismatch(n, path, "a list")
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		d.decode(item, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
	}
	v.Set(s)
}

// keys walks a mapping's entries, refusing keys that are not scalars and
// repeated keys (noun names a key in the message: "key", "field").
func (d *decoder) keys(n *yaml.Node, path, noun string, each func(k, val *yaml.Node, p string)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.fail(k, path, "keys must be strings, got %s", describe(k))
			continue
		}
		p := Join(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			d.fail(k, p, "duplicate %s (first at line %d)", noun, first)
			continue
		}
		seen[k.Value] = k.Line
		each(k, val, p)
	}
}

func (d *decoder) decodeMap(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.mismatch(n, path, "a mapping")
		return
	}
	m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
	d.keys(n, path, "key", func(k, val *yaml.Node, p string) {
		elem := reflect.New(v.Type().Elem()).Elem()
		d.decode(val, elem, p)
		m.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), elem)
	})
	v.Set(m)
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.mismatch(n, path, "a mapping")
		return
	}
	fields := fieldsOf(v.Type(), d.opts.Tag)
	d.keys(n, path, "field", func(k, val *yaml.Node, p string) {
		i := slices.IndexFunc(fields, func(f field) bool { return f.name == k.Value })
		if i >= 0 {
			d.decode(val, v.FieldByIndex(fields[i].index), p)
			return
		}
		if d.opts.Unknown != nil {
			if e := d.opts.Unknown(k, val, p); e != nil {
				d.errs = append(d.errs, e)
			}
			return
		}
		if near := nearest(k.Value, fields); near != "" {
			d.fail(k, p, "unknown field, did you mean %s? (known: %s)", near, knownNames(fields))
			return
		}
		d.fail(k, p, "unknown field (known: %s)", knownNames(fields))
	})
}

func (d *decoder) decodeScalar(n *yaml.Node, v reflect.Value, path string) {
	switch v.Kind() {
	case reflect.String:
		if n.Kind != yaml.ScalarNode || !d.textTag(n.ShortTag()) {
			d.mismatch(n, path, "a string")
			return
		}
		v.SetString(n.Value)
	case reflect.Bool:
		var b bool
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
			d.mismatch(n, path, "true or false")
			return
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		d.decodeInt(n, v, path)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		d.decodeUint(n, v, path)
	default:
		d.fail(n, path, "unsupported field type %s", v.Type())
	}
}

// textTag reports whether a string field takes a scalar of this tag.
func (d *decoder) textTag(tag string) bool {
	return d.opts.StringTags == nil || tag == "!!str" || slices.Contains(d.opts.StringTags, tag)
}

// decodeInt fills a signed integer of any width; a value the field's type
// cannot hold is an error naming the type's range, never a silent wrap.
func (d *decoder) decodeInt(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.mismatch(n, path, "an integer")
		return
	}
	i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
	if err != nil || v.OverflowInt(i) {
		bits := v.Type().Bits()
		lo, hi := int64(-1)<<(bits-1), int64(uint64(1)<<(bits-1)-1)
		d.fail(n, path, "must be an integer between %d and %d, got %q", lo, hi, n.Value)
		return
	}
	v.SetInt(i)
}

// decodeUint fills an unsigned integer of any width.
func (d *decoder) decodeUint(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.mismatch(n, path, "a non-negative integer")
		return
	}
	u, err := strconv.ParseUint(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
	if err != nil || v.OverflowUint(u) {
		hi := uint64(math.MaxUint64) >> (64 - v.Type().Bits())
		d.fail(n, path, "must be an integer between 0 and %d, got %q", hi, n.Value)
		return
	}
	v.SetUint(u)
}

// field is one settable struct field, with embedded structs flattened.
type field struct {
	name  string
	index []int
}

func fieldsOf(t reflect.Type, tagKey string) []field {
	var out []field
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get(tagKey), ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			// An embedded struct's fields are the outer struct's, exported
			// or not (as encoding/json has them).
			for _, sub := range fieldsOf(f.Type, tagKey) {
				out = append(out, field{name: sub.name, index: append([]int{i}, sub.index...)})
			}
			continue
		}
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, field{name: name, index: []int{i}})
	}
	return out
}

// nearest is the known field name a misspelt key most likely meant: the one
// closest to it in edit distance, when that distance is small for the key's
// length and no other name is as close; "" otherwise.
func nearest(key string, fs []field) string {
	best, bestD, tie := "", len(key)/4+2, false
	for _, f := range fs {
		d := editDistance(strings.ToLower(key), strings.ToLower(f.name))
		switch {
		case d < bestD:
			best, bestD, tie = f.name, d, false
		case d == bestD && best != "":
			tie = true
		}
	}
	if tie || bestD >= len(key) {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (bytes: field names
// are ASCII).
func editDistance(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func knownNames(fs []field) string {
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.name
	}
	return strings.Join(names, ", ")
}

// scalarNames names the YAML types of scalars that are not text.
var scalarNames = map[string]string{
	"!!int": "an integer", "!!float": "a float", "!!bool": "a boolean",
	"!!timestamp": "a timestamp", "!!binary": "binary data",
}

// describe names what a node holds for a message: a string value quoted,
// another scalar with its YAML type ("1.5 (a float)").
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		switch tag := n.ShortTag(); tag {
		case "!!str":
			return strconv.Quote(n.Value)
		case "!!null":
			return "null"
		default:
			name := scalarNames[tag]
			if name == "" {
				name = tag
			}
			return strconv.Quote(n.Value) + " (" + name + ")"
		}
	}
	return "nothing"
}
