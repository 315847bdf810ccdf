// Package manifest reads Kubernetes objects from multi-document YAML (or JSON)
// files and keeps the yaml.v3 node of every object, so checks can report the
// file, line and column of the exact field they object to.
//
// Reading is bounded: a file larger than Options.MaxFileBytes is refused before
// it is read, a document whose alias expansion would exceed Options.MaxNodes
// (a "billion laughs" bomb) or that refers to itself is refused, and every
// parser error is returned with its file and line, never skipped.
//
// Its Object is the input of the render gate (pkg/assert.Run): read the
// committed manifests with ReadPaths (or Parse bytes already in memory) and
// hand the objects over.
package manifest

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// Defaults for Options fields left at zero.
const (
	// DefaultMaxFileBytes is the largest file (or stdin stream) read: 32 MiB,
	// well above any real manifest set and small enough to hold in memory.
	DefaultMaxFileBytes int64 = 32 << 20
	// DefaultMaxTotalBytes bounds all inputs of one ReadPaths together: 256 MiB.
	DefaultMaxTotalBytes int64 = 256 << 20
	// DefaultMaxDocuments is the most YAML documents read from one file.
	DefaultMaxDocuments = 100_000
	// DefaultMaxNodes is the most YAML nodes one document may expand to once
	// aliases are followed (yamlpos.DefaultMaxNodes).
	DefaultMaxNodes = yamlpos.DefaultMaxNodes
	// DefaultMaxDepth is the deepest nesting accepted in a document.
	DefaultMaxDepth = yamlpos.DefaultMaxDepth
)

// Options bound what Read accepts. The zero value uses the defaults above.
type Options struct {
	// MaxFileBytes limits the size of one input. Default DefaultMaxFileBytes.
	MaxFileBytes int64
	// MaxTotalBytes limits the inputs of one ReadPaths together. Default DefaultMaxTotalBytes.
	MaxTotalBytes int64
	// MaxDocuments limits the documents per input. Default DefaultMaxDocuments.
	MaxDocuments int
	// MaxNodes limits a document's size after alias expansion. Default DefaultMaxNodes.
	MaxNodes int
	// MaxDepth limits nesting. Default DefaultMaxDepth.
	MaxDepth int
	// SkipForeign, when set, makes ReadPaths skip a file found by walking a
	// directory when none of its documents is a Kubernetes object (no
	// apiVersion and kind: CI configuration, Helm values, pre-commit
	// hooks), and pass its name here instead of failing. A file named
	// directly, or one that mixes objects with other documents, still fails
	// with ErrNotAnObject.
	SkipForeign func(file string)
}

// readerOptions are the YAML reader's bounds for input name.
func (o Options) readerOptions(name string) yamlpos.Options {
	return yamlpos.Options{File: name, MaxNodes: o.MaxNodes, MaxDepth: o.MaxDepth}
}

func (o Options) withDefaults() Options {
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	if o.MaxTotalBytes <= 0 {
		o.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if o.MaxDocuments <= 0 {
		o.MaxDocuments = DefaultMaxDocuments
	}
	if o.MaxNodes <= 0 {
		o.MaxNodes = DefaultMaxNodes
	}
	if o.MaxDepth <= 0 {
		o.MaxDepth = DefaultMaxDepth
	}
	return o
}

// Object is one Kubernetes object and where it came from.
type Object struct {
	// File is the path the object was read from ("-" or a name for stdin).
	File string
	// Document is the 0-based index of the YAML document in File.
	Document int
	// Node is the object's mapping node (aliases are left unexpanded).
	Node *yaml.Node

	APIVersion string
	Kind       string
	Namespace  string
	Name       string

	// In names the object a document was read from inside ("ConfigMap
	// ns/name data[key]" for a rate limit config a ConfigMap holds); empty
	// for a document of File itself.
	In string
}

// KindRateLimitConfig is the Kind given to a document in the rate limit
// service's own file format (envoyproxy/ratelimit's runtime config, which
// `budgetgen render --ratelimit-config` writes: a mapping with a `domain`
// and a `descriptors` list, and no apiVersion or kind). APIVersion stays
// empty and Name is the domain. The gate reads these files because
// agentgateway's caps and shadow mode live only there.
const KindRateLimitConfig = "RateLimitConfig"

// IsRateLimitConfig reports whether o is a rate limit service config document.
func (o *Object) IsRateLimitConfig() bool { return o.APIVersion == "" && o.Kind == KindRateLimitConfig }

// isRateLimitConfig: a scalar domain and a descriptors sequence.
func isRateLimitConfig(root *yaml.Node) bool {
	d, ds := Get(root, "domain"), Get(root, "descriptors")
	return d != nil && d.Kind == yaml.ScalarNode && Str(d) != "" && ds != nil && ds.Kind == yaml.SequenceNode
}

// Group returns the API group of the object ("" for the core group).
func (o *Object) Group() string {
	if i := strings.LastIndex(o.APIVersion, "/"); i >= 0 {
		return o.APIVersion[:i]
	}
	return ""
}

// Line and Column of the object's first key.
func (o *Object) Line() int   { return o.Node.Line }
func (o *Object) Column() int { return o.Node.Column }

// String names the object as Kind namespace/name (or Kind name when cluster
// scoped), followed by "in <In>" for a document read from inside another.
func (o *Object) String() string {
	s := o.Kind + " " + o.Name
	if o.Namespace != "" {
		s = o.Kind + " " + o.Namespace + "/" + o.Name
	}
	if o.In != "" {
		s += " in " + o.In
	}
	return s
}

// Decode converts the object to plain Go values (map[string]any, []any, ...),
// following aliases. Safe after Read: the expanded size was checked.
func (o *Object) Decode() (map[string]any, error) {
	var v map[string]any
	if err := o.Node.Decode(&v); err != nil {
		return nil, &Error{File: o.File, Line: o.Node.Line, Column: o.Node.Column, Err: err}
	}
	return v, nil
}

// Error is a reading error with the position it refers to (Line 0 when the
// whole input is at fault, such as a missing file or one too large): the
// positioned error of every YAML reader, here with its cause in Err.
type Error = yamlpos.Error

// Sentinel errors, matched with errors.Is. The YAML reader's own are
// yamlpos's.
var (
	ErrTooLarge    = errors.New("input too large")
	ErrAliasBomb   = yamlpos.ErrAliasBomb
	ErrAliasCycle  = yamlpos.ErrAliasCycle
	ErrTooDeep     = yamlpos.ErrTooDeep
	ErrNotAnObject = errors.New("not a Kubernetes object")
	ErrTooManyDocs = errors.New("too many documents")
	ErrInvalidYAML = yamlpos.ErrSyntax
)

// Read parses every document of one input. name is used in positions and
// errors. Empty documents (a lone "---", comments) are skipped; a List kind
// (kind: List, or any *List with items) contributes its items.
func Read(name string, r io.Reader, opts Options) ([]*Object, error) {
	opts = opts.withDefaults()
	data, err := io.ReadAll(io.LimitReader(r, opts.MaxFileBytes+1))
	if err != nil {
		return nil, &Error{File: name, Err: fmt.Errorf("read: %w", err)}
	}
	if int64(len(data)) > opts.MaxFileBytes {
		return nil, &Error{File: name, Err: fmt.Errorf("%w: more than %d bytes (raise --max-file-size to read it)", ErrTooLarge, opts.MaxFileBytes)}
	}
	return Parse(name, data, opts)
}

// Parse is Read over bytes already in memory.
func Parse(name string, data []byte, opts Options) ([]*Object, error) {
	opts = opts.withDefaults()
	if int64(len(data)) > opts.MaxFileBytes {
		return nil, &Error{File: name, Err: fmt.Errorf("%w: more than %d bytes (raise --max-file-size to read it)", ErrTooLarge, opts.MaxFileBytes)}
	}
	var objs []*Object
	r := yamlpos.NewReader(data, opts.readerOptions(name))
	for doc := 0; ; doc++ {
		if doc >= opts.MaxDocuments {
			return nil, &Error{File: name, Err: fmt.Errorf("%w: more than %d", ErrTooManyDocs, opts.MaxDocuments)}
		}
		n, err := r.Next() // syntax errors and documents past the bounds are positioned *Errors
		if err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(n.Content) == 0 {
			continue
		}
		root := n.Content[0]
		if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
			continue
		}
		got, err := objects(name, doc, root, data, opts)
		if err != nil {
			return nil, err
		}
		objs = append(objs, got...)
	}
}

func objects(name string, doc int, root *yaml.Node, src []byte, opts Options) ([]*Object, error) {
	root = Resolve(root)
	if root.Kind != yaml.MappingNode {
		return nil, &Error{File: name, Line: root.Line, Column: root.Column, Err: fmt.Errorf("%w: document is a %s, want a mapping with apiVersion and kind", ErrNotAnObject, kindName(root))}
	}
	o := &Object{File: name, Document: doc, Node: root}
	o.APIVersion = Str(Get(root, "apiVersion"))
	o.Kind = Str(Get(root, "kind"))
	if o.APIVersion == "" && o.Kind == "" && isRateLimitConfig(root) {
		o.Kind, o.Name = KindRateLimitConfig, Str(Get(root, "domain"))
		return []*Object{o}, nil
	}
	if o.APIVersion == "" || o.Kind == "" {
		return nil, &Error{File: name, Line: root.Line, Column: root.Column, Err: fmt.Errorf("%w: document has no apiVersion or kind", ErrNotAnObject)}
	}
	if items := Get(root, "items"); strings.HasSuffix(o.Kind, "List") && items != nil {
		var out []*Object
		for _, it := range Items(items) {
			got, err := objects(name, doc, it, src, opts)
			if err != nil {
				return nil, err
			}
			out = append(out, got...)
		}
		return out, nil
	}
	o.Namespace = Str(Get(root, "metadata", "namespace"))
	o.Name = Str(Get(root, "metadata", "name"))
	return append([]*Object{o}, configMapRateLimitConfigs(o, src, opts)...), nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "sequence"
	case yaml.ScalarNode:
		return "scalar"
	default:
		return "non-mapping node"
	}
}
