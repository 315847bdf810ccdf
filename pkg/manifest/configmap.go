package manifest

import (
	"bytes"
	"errors"
	"io"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// configMapRateLimitConfigs returns the rate limit service config documents
// a v1 ConfigMap holds in its data, as RateLimitConfig objects. kustomize's
// configMapGenerator puts the files `render --ratelimit-config` writes
// there, and that ConfigMap is what the service is given, so the gate can
// check the output of `kustomize build` itself.
//
// A literal block (`|`, how kustomize and kubectl write multi-line data) maps
// line for line onto the file, so the documents' nodes are moved to their
// place in it (src is the file's bytes); any other style of value puts them
// all at the value. Data that is not a rate limit config (anything a
// ConfigMap may hold, valid YAML or not) is skipped.
func configMapRateLimitConfigs(cm *Object, src []byte, opts Options) []*Object {
	if cm.APIVersion != "v1" || cm.Kind != "ConfigMap" {
		return nil
	}
	data := Resolve(Get(cm.Node, "data"))
	if data == nil || data.Kind != yaml.MappingNode {
		return nil
	}
	var out []*Object
	for i := 0; i+1 < len(data.Content); i += 2 {
		k, v := data.Content[i], Resolve(data.Content[i+1])
		if v.Kind != yaml.ScalarNode || !strings.Contains(v.Value, "descriptors") {
			continue
		}
		for _, root := range rateLimitDocuments(v.Value, opts) {
			place(root, v, src)
			out = append(out, &Object{
				File: cm.File, Document: cm.Document, Node: root,
				Kind: KindRateLimitConfig, Name: Str(Get(root, "domain")),
				In: cm.String() + " data[" + Str(k) + "]",
			})
		}
	}
	return out
}

// rateLimitDocuments parses text and returns its rate limit config
// documents, within the same bounds as a file; nil on any parse failure.
func rateLimitDocuments(text string, opts Options) (roots []*yaml.Node) {
	r := yamlpos.NewReader([]byte(text), opts.readerOptions(""))
	for doc := 0; doc < opts.MaxDocuments; doc++ {
		n, err := r.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return roots
			}
			return nil // malformed or past the bounds: not a config
		}
		if len(n.Content) == 0 {
			continue
		}
		root := Resolve(n.Content[0])
		if root.Kind == yaml.MappingNode && Get(root, "apiVersion") == nil && Get(root, "kind") == nil && isRateLimitConfig(root) {
			roots = append(roots, root)
		}
	}
	return roots
}

// place moves the nodes parsed from value v's text to where that text is in
// the file: a literal block's line n is the file's line v.Line+n, indented
// by the block's indentation; any other style puts every node at v.
func place(root, v *yaml.Node, src []byte) {
	line, col, exact := v.Line, v.Column, false
	if v.Style&yaml.LiteralStyle != 0 {
		if indent, ok := lineIndent(src, v.Line+1); ok {
			col, exact = indent, true
		}
	}
	seen := map[*yaml.Node]bool{}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n == nil || seen[n] {
			return
		}
		seen[n] = true
		if exact {
			n.Line, n.Column = line+n.Line, col+n.Column
		} else {
			n.Line, n.Column = line, col
		}
		for _, c := range n.Content {
			walk(c)
		}
		walk(n.Alias)
	}
	walk(root)
}

// lineIndent returns the number of leading spaces of the first line of src
// from the 1-based line n on that is not blank, and false when there is none.
func lineIndent(src []byte, n int) (int, bool) {
	for i := 1; len(src) > 0; i++ {
		line, rest, _ := bytes.Cut(src, []byte("\n"))
		if i >= n && len(bytes.TrimSpace(line)) > 0 {
			return len(line) - len(bytes.TrimLeft(line, " ")), true
		}
		src = rest
	}
	return 0, false
}
