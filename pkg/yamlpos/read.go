package yamlpos

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"gopkg.in/yaml.v3"
)

// Defaults for Options fields left at zero.
const (
	// DefaultMaxNodes is the most YAML nodes one document may expand to once
	// aliases are followed. A billion-laughs document is tiny on disk but
	// expands to ~10^9 nodes; a BackendTrafficPolicy with 256 rules has a few
	// tens of thousands.
	DefaultMaxNodes = 1_000_000
	// DefaultMaxDepth is the deepest nesting accepted in a document.
	DefaultMaxDepth = 256
)

// Sentinel errors, matched with errors.Is through an Error's Err.
var (
	ErrSyntax     = errors.New("invalid YAML")
	ErrAliasBomb  = errors.New("document expands to too many nodes through aliases")
	ErrAliasCycle = errors.New("document refers to itself through an alias")
	ErrTooDeep    = errors.New("document nested too deeply")
)

// Options say how a Reader reads and Decode decodes. The zero value reads
// with the defaults above and decodes by json tags.
type Options struct {
	// File names the input in errors.
	File string
	// MaxNodes bounds a document's size after alias expansion. Default
	// DefaultMaxNodes.
	MaxNodes int
	// MaxDepth bounds nesting. Default DefaultMaxDepth.
	MaxDepth int
	// LinesOnly leaves the column out of errors, for a format whose other
	// problems are found later by field path (Positions.Of(path).Line), so
	// that all its errors read alike. Default: columns are reported.
	LinesOnly bool

	// Tag is the struct tag naming fields for Decode: "json" (the default)
	// or "yaml". A field without the tag is named as in Go; "-" skips it.
	Tag string
	// NoAliases makes Decode refuse aliases. Default: followed (the Reader
	// has bounded what they expand to).
	NoAliases bool
	// StringTags, when set, are the only YAML tags a string field accepts
	// besides !!str (the rate limit config's reference accepts integers and
	// booleans as text, not floats or timestamps). Default: any scalar.
	StringTags []string
	// Unknown decides about a mapping key that names no field of the struct
	// being decoded: nil accepts the key, an Error refuses it. Default (nil
	// func): refused, naming the known fields.
	Unknown func(key, value *yaml.Node, path string) *Error
}

func (o Options) withDefaults() Options {
	if o.MaxNodes <= 0 {
		o.MaxNodes = DefaultMaxNodes
	}
	if o.MaxDepth <= 0 {
		o.MaxDepth = DefaultMaxDepth
	}
	if o.Tag == "" {
		o.Tag = "json"
	}
	return o
}

// Errorf builds an Error at node n (nil: no position) and path.
func (o Options) Errorf(n *yaml.Node, path, format string, args ...any) *Error {
	return o.errorAt(At(n), path, fmt.Sprintf(format, args...), nil)
}

func (o Options) errorAt(at Pos, path, msg string, err error) *Error {
	if o.LinesOnly {
		at.Column = 0
	}
	return &Error{File: o.File, Line: at.Line, Column: at.Column, Path: path, Msg: msg, Err: err}
}

// Reader reads the YAML documents of one input in turn.
type Reader struct {
	opts Options
	dec  *yaml.Decoder
	err  error
	data []byte // for the hints of syntax errors
}

// NewReader reads data's documents. UTF-16 input (a byte order mark FE FF
// or FF FE) is refused at line 1: yaml.v3 would decode it, but its lines
// would then not be the file's, and every position would be wrong.
func NewReader(data []byte, opts Options) *Reader {
	r := &Reader{opts: opts.withDefaults(), dec: yaml.NewDecoder(bytes.NewReader(data)), data: data}
	if bytes.HasPrefix(data, []byte{0xfe, 0xff}) || bytes.HasPrefix(data, []byte{0xff, 0xfe}) {
		r.err = r.opts.errorAt(Pos{Line: 1}, "", "", fmt.Errorf("%w: the file is UTF-16 (it starts with the byte order mark % X); save it as UTF-8", ErrSyntax, data[:2]))
	}
	return r
}

// Next returns the next document node (Kind yaml.DocumentNode; its one
// child, when it has one, is the document's root), or io.EOF after the last.
// Any other error is an *Error: a syntax error (ErrSyntax) at the parser's
// line, or a document past the bounds (ErrAliasBomb, ErrAliasCycle,
// ErrTooDeep) at its root. After an error, Next keeps returning it.
func (r *Reader) Next() (doc *yaml.Node, err error) {
	if r.err != nil {
		return nil, r.err
	}
	defer func() {
		// yaml.v3 reports some malformed input by panicking inside its
		// decoder (it recovers its own failures, not every runtime error).
		// A reader of untrusted files must not take the process down.
		if p := recover(); p != nil {
			doc, err = nil, r.opts.errorAt(Pos{}, "", "", fmt.Errorf("%w: parser failed: %v", ErrSyntax, p))
		}
		if err != nil {
			r.err = err
		}
	}()
	var n yaml.Node
	if err := r.dec.Decode(&n); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		line, msg := splitLine(err.Error())
		line, msg = syntaxHint(r.data, line, msg)
		return nil, r.opts.errorAt(Pos{Line: line}, "", "", fmt.Errorf("%w: %s", ErrSyntax, msg))
	}
	for _, root := range n.Content {
		if err := checkSize(root, r.opts); err != nil {
			return nil, r.opts.errorAt(At(root), "", "", err)
		}
	}
	return &n, nil
}

// One reads an input that holds exactly one document and returns its root.
// kind names what the document is ("BudgetSet") and file what the input is
// ("spec file"), for the errors an empty input or a second document get.
func One(data []byte, opts Options, kind, file string) (*yaml.Node, *Error) {
	r := NewReader(data, opts)
	doc, err := r.Next()
	if errors.Is(err, io.EOF) || (err == nil && len(doc.Content) == 0) {
		return nil, r.opts.errorAt(Pos{}, "", "empty document: expected a "+kind, nil)
	}
	if err != nil {
		return nil, r.positioned(err)
	}
	switch extra, err := r.Next(); {
	case err == nil:
		return nil, r.opts.errorAt(At(extra), "", fmt.Sprintf("more than one YAML document: a %s holds exactly one %s", file, kind), nil)
	case !errors.Is(err, io.EOF):
		return nil, r.positioned(err)
	}
	return doc.Content[0], nil
}

// positioned is err, one of Next's, as the *Error it is.
func (r *Reader) positioned(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return r.opts.errorAt(Pos{}, "", "", err)
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
				return 0, fmt.Errorf("%w: alias %q has no anchor", ErrSyntax, n.Value)
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
