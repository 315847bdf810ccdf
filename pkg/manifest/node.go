package manifest

import (
	"strconv"

	"gopkg.in/yaml.v3"
)

// Resolve follows an alias to its anchored node; other nodes are returned as is.
func Resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 64; i++ {
		n = n.Alias
	}
	return n
}

// Get walks mapping keys from n and returns the value node, or nil when a key
// is missing or a step is not a mapping.
func Get(n *yaml.Node, path ...string) *yaml.Node {
	n = Resolve(n)
	for _, key := range path {
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = Resolve(n.Content[i+1])
				break
			}
		}
		n = next
	}
	return n
}

// Key returns the key node of a mapping entry (for reporting the position of a
// field name), or nil.
func Key(n *yaml.Node, key string) *yaml.Node {
	n = Resolve(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i]
		}
	}
	return nil
}

// Items returns the elements of a sequence node (nil for anything else).
func Items(n *yaml.Node) []*yaml.Node {
	n = Resolve(n)
	if n == nil || n.Kind != yaml.SequenceNode {
		return nil
	}
	out := make([]*yaml.Node, len(n.Content))
	for i, c := range n.Content {
		out[i] = Resolve(c)
	}
	return out
}

// Pairs returns a mapping's keys and values in order.
func Pairs(n *yaml.Node) (keys, values []*yaml.Node) {
	n = Resolve(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		keys = append(keys, n.Content[i])
		values = append(values, Resolve(n.Content[i+1]))
	}
	return keys, values
}

// Str returns a scalar's value, or "" for nil and non-scalars.
func Str(n *yaml.Node) string {
	n = Resolve(n)
	if n == nil || n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return ""
	}
	return n.Value
}

// Bool reports a scalar's boolean value and whether it is a boolean at all.
func Bool(n *yaml.Node) (value, ok bool) {
	n = Resolve(n)
	if n == nil || n.Kind != yaml.ScalarNode {
		return false, false
	}
	switch n.Value {
	case "true", "True", "TRUE":
		return true, true
	case "false", "False", "FALSE":
		return false, true
	}
	return false, false
}

// Int reports a scalar's integer value and whether it is an integer.
func Int(n *yaml.Node) (int64, bool) {
	n = Resolve(n)
	if n == nil || n.Kind != yaml.ScalarNode {
		return 0, false
	}
	v, err := strconv.ParseInt(n.Value, 0, 64)
	if err != nil {
		return 0, false
	}
	return v, true
}
