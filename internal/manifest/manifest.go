// Package manifest reads Kubernetes objects from multi-document YAML (or JSON)
// files and keeps the yaml.v3 node of every object, so checks can report the
// file, line and column of the exact field they object to.
//
// Reading is bounded: a file larger than Options.MaxFileBytes is refused before
// it is read, a document whose alias expansion would exceed Options.MaxNodes
// (a "billion laughs" bomb) or that refers to itself is refused, and every
// parser error is returned with its file and line, never skipped.
package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/internal/safetext"
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
	// aliases are followed. A billion-laughs document is tiny on disk but
	// expands to ~10^9 nodes; a real BackendTrafficPolicy with 256 rules has
	// a few tens of thousands.
	DefaultMaxNodes = 1_000_000
	// DefaultMaxDepth is the deepest nesting accepted in a document.
	DefaultMaxDepth = 256
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
// whole input is at fault, such as a missing file or one too large).
type Error struct {
	File   string
	Line   int
	Column int
	Err    error
}

func (e *Error) Error() string {
	file := safetext.Inline(e.File) // the message stays one line whatever the file name holds
	switch {
	case e.Line > 0 && e.Column > 0:
		return fmt.Sprintf("%s:%d:%d: %v", file, e.Line, e.Column, e.Err)
	case e.Line > 0:
		return fmt.Sprintf("%s:%d: %v", file, e.Line, e.Err)
	default:
		return fmt.Sprintf("%s: %v", file, e.Err)
	}
}

func (e *Error) Unwrap() error { return e.Err }

// Sentinel errors, matched with errors.Is.
var (
	ErrTooLarge    = errors.New("input too large")
	ErrAliasBomb   = errors.New("document expands to too many nodes through aliases")
	ErrAliasCycle  = errors.New("document refers to itself through an alias")
	ErrTooDeep     = errors.New("document nested too deeply")
	ErrNotAnObject = errors.New("not a Kubernetes object")
	ErrTooManyDocs = errors.New("too many documents")
	ErrInvalidYAML = errors.New("invalid YAML")
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
func Parse(name string, data []byte, opts Options) (objs []*Object, err error) {
	opts = opts.withDefaults()
	if int64(len(data)) > opts.MaxFileBytes {
		return nil, &Error{File: name, Err: fmt.Errorf("%w: more than %d bytes (raise --max-file-size to read it)", ErrTooLarge, opts.MaxFileBytes)}
	}
	// yaml.v3 reports some malformed input by panicking inside its decoder
	// (it recovers its own failf panics, not every runtime error). A reader of
	// untrusted files must not take the process down: turn it into an error.
	defer func() {
		if r := recover(); r != nil {
			objs = nil
			err = &Error{File: name, Err: fmt.Errorf("%w: parser failed: %v", ErrInvalidYAML, r)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for doc := 0; ; doc++ {
		if doc >= opts.MaxDocuments {
			return nil, &Error{File: name, Err: fmt.Errorf("%w: more than %d", ErrTooManyDocs, opts.MaxDocuments)}
		}
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, yamlError(name, err)
		}
		if n.Kind == 0 || len(n.Content) == 0 {
			continue
		}
		root := n.Content[0]
		if err := checkSize(root, opts); err != nil {
			return nil, &Error{File: name, Line: root.Line, Column: root.Column, Err: err}
		}
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

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlError keeps the parser's message and moves its line into the position.
func yamlError(name string, err error) error {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{File: name, Line: line, Err: fmt.Errorf("%w: %s", ErrInvalidYAML, m[2])}
	}
	return &Error{File: name, Err: fmt.Errorf("%w: %s", ErrInvalidYAML, strings.TrimPrefix(msg, "yaml: "))}
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

// checkSize counts the nodes a document expands to when aliases are
// followed, without expanding them: an anchor's size is computed once and
// reused by every alias, so a billion-laughs document costs its own size.
func checkSize(root *yaml.Node, opts Options) error {
	const inProgress = -1
	memo := map[*yaml.Node]int{}
	var walk func(n *yaml.Node, depth int) (int, error)
	walk = func(n *yaml.Node, depth int) (int, error) {
		if depth > opts.MaxDepth {
			return 0, fmt.Errorf("%w: deeper than %d", ErrTooDeep, opts.MaxDepth)
		}
		if n.Kind == yaml.AliasNode {
			if n.Alias == nil {
				return 0, fmt.Errorf("%w: alias %q has no anchor", ErrInvalidYAML, n.Value)
			}
			n = n.Alias
		}
		if v, ok := memo[n]; ok {
			if v == inProgress {
				return 0, fmt.Errorf("%w: *%s", ErrAliasCycle, n.Anchor)
			}
			return v, nil
		}
		memo[n] = inProgress
		total := 1
		for _, c := range n.Content {
			s, err := walk(c, depth+1)
			if err != nil {
				return 0, err
			}
			total += s
			if total > opts.MaxNodes {
				return 0, fmt.Errorf("%w: more than %d nodes", ErrAliasBomb, opts.MaxNodes)
			}
		}
		memo[n] = total
		return total, nil
	}
	_, err := walk(root, 0)
	return err
}
