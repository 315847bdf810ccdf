package promote

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// The spec file is edited as text at positions found through yaml.v3 nodes,
// never re-encoded: re-encoding loses blank lines, re-indents sequences and
// rewrites quoting, which would turn a one-field change into a noisy GitOps
// diff. Only the bytes of the values that change are touched.

// budgetNode is one budget's mapping in the spec document.
type budgetNode struct {
	name    string
	mapping *yaml.Node // MappingNode
	flow    bool       // written as {a: b, ...}
}

// field returns the key and value nodes of key in the budget mapping.
func (b *budgetNode) field(key string) (k, v *yaml.Node) {
	for i := 0; i+1 < len(b.mapping.Content); i += 2 {
		if b.mapping.Content[i].Value == key {
			return b.mapping.Content[i], b.mapping.Content[i+1]
		}
	}
	return nil, nil
}

// line returns the line of key in the budget, or of its first field when
// key is absent.
func (b *budgetNode) line(key string) int {
	if k, _ := b.field(key); k != nil {
		return k.Line
	}
	if len(b.mapping.Content) > 0 {
		return b.mapping.Content[0].Line
	}
	return b.mapping.Line
}

// scalar returns the value of key when it is a scalar, "" otherwise.
func (b *budgetNode) scalar(key string) (string, bool) {
	_, v := b.field(key)
	if v == nil || v.Kind != yaml.ScalarNode {
		return "", false
	}
	return v.Value, true
}

// findBudgets parses src and returns every budget by name: the entries of
// spec.budgets and the frontier cap (spec.frontier, named by its name field or
// "frontier").
func findBudgets(file string, src []byte) ([]*budgetNode, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: not a YAML mapping document", file)
	}
	spec := mapValue(doc.Content[0], "spec")
	if spec == nil || spec.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: no spec mapping", file)
	}
	var out []*budgetNode
	if list := mapValue(spec, "budgets"); list != nil {
		if list.Kind != yaml.SequenceNode {
			return nil, fmt.Errorf("%s:%d: spec.budgets: want a list", file, list.Line)
		}
		for _, item := range list.Content {
			if item.Kind != yaml.MappingNode {
				return nil, fmt.Errorf("%s:%d: spec.budgets: want a mapping per budget", file, item.Line)
			}
			n := mapValue(item, "name")
			if n == nil || n.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("%s:%d: spec.budgets: budget without a name", file, item.Line)
			}
			out = append(out, &budgetNode{name: n.Value, mapping: item, flow: item.Style&yaml.FlowStyle != 0})
		}
	}
	if fr := mapValue(spec, "frontier"); fr != nil && fr.Kind == yaml.MappingNode {
		name := "frontier"
		if n := mapValue(fr, "name"); n != nil && n.Kind == yaml.ScalarNode && n.Value != "" {
			name = n.Value
		}
		out = append(out, &budgetNode{name: name, mapping: fr, flow: fr.Style&yaml.FlowStyle != 0})
	}
	return out, nil
}

func mapValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// fieldOp sets (or, with remove, deletes) one scalar field of a budget.
type fieldOp struct {
	key    string
	value  string // YAML text of the new value, already quoted if needed
	remove bool
}

// edit replaces src[start:end] with text.
type edit struct {
	start, end int
	text       string
}

// source indexes line starts so node positions (1-based line, rune column)
// become byte offsets.
type source struct {
	src   []byte
	lines []int // byte offset of each line start
}

func newSource(src []byte) *source {
	s := &source{src: src, lines: []int{0}}
	for i, c := range src {
		if c == '\n' {
			s.lines = append(s.lines, i+1)
		}
	}
	return s
}

func (s *source) offset(line, col int) (int, error) {
	if line < 1 || line > len(s.lines) {
		return 0, fmt.Errorf("line %d out of range", line)
	}
	off := s.lines[line-1]
	for c := 1; c < col; c++ {
		if off >= len(s.src) || s.src[off] == '\n' {
			return 0, fmt.Errorf("column %d out of range on line %d", col, line)
		}
		_, w := utf8.DecodeRune(s.src[off:])
		off += w
	}
	return off, nil
}

func (s *source) lineEnd(off int) int {
	if i := bytes.IndexByte(s.src[off:], '\n'); i >= 0 {
		return off + i
	}
	return len(s.src)
}

// newline returns the line break of the line holding off ("\r\n" in a file
// kept with CRLF endings, else "\n"); the last line, without one, follows the
// line before it. Inserted lines use it, so a CRLF file stays CRLF.
func (s *source) newline(off int) string {
	end := s.lineEnd(off)
	if end == len(s.src) {
		start := bytes.LastIndexByte(s.src[:min(off, len(s.src))], '\n')
		if start < 0 {
			return "\n"
		}
		end = start
	}
	if end > 0 && s.src[end-1] == '\r' {
		return "\r\n"
	}
	return "\n"
}

// scalarSpan returns the byte range of a single-line scalar's source token.
func (s *source) scalarSpan(n *yaml.Node, flow bool) (int, int, error) {
	if n.Kind != yaml.ScalarNode {
		return 0, 0, fmt.Errorf("line %d: want a scalar value", n.Line)
	}
	start, err := s.offset(n.Line, n.Column)
	if err != nil {
		return 0, 0, err
	}
	end := s.lineEnd(start)
	switch {
	case n.Style&yaml.DoubleQuotedStyle != 0:
		for i := start + 1; i < end; i++ {
			if s.src[i] == '\\' {
				i++
				continue
			}
			if s.src[i] == '"' {
				return start, i + 1, nil
			}
		}
	case n.Style&yaml.SingleQuotedStyle != 0:
		for i := start + 1; i < end; i++ {
			if s.src[i] == '\'' {
				if i+1 < end && s.src[i+1] == '\'' {
					i++
					continue
				}
				return start, i + 1, nil
			}
		}
	case n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0:
		return 0, 0, fmt.Errorf("line %d: block scalars are not edited; write the value on one line", n.Line)
	default:
		if strings.ContainsAny(n.Value, "\n") {
			return 0, 0, fmt.Errorf("line %d: multi-line value is not edited; write it on one line", n.Line)
		}
		i := start
		for i < end {
			c := s.src[i]
			if c == '#' && i > start && (s.src[i-1] == ' ' || s.src[i-1] == '\t') {
				break
			}
			if flow && (c == ',' || c == '}' || c == ']') {
				break
			}
			i++
		}
		// A CRLF line's "\r" is its line break, not the value's.
		for i > start && (s.src[i-1] == ' ' || s.src[i-1] == '\t' || s.src[i-1] == '\r') {
			i--
		}
		return start, i, nil
	}
	return 0, 0, fmt.Errorf("line %d: unterminated quoted value", n.Line)
}

// planEdits turns field operations on one budget into byte edits. New fields
// go right after the anchor field (the first present of anchors), on their own
// line in block style or as ", key: value" in flow style.
func planEdits(s *source, b *budgetNode, ops []fieldOp, anchors []string) ([]edit, error) {
	var edits []edit
	var inserts []fieldOp
	for _, op := range ops {
		k, v := b.field(op.key)
		switch {
		case k == nil && op.remove:
			// nothing to remove
		case k == nil:
			inserts = append(inserts, op)
		case op.remove:
			e, err := removeEdit(s, b, k, v)
			if err != nil {
				return nil, fmt.Errorf("remove %s: %w", op.key, err)
			}
			edits = append(edits, e)
		default:
			start, end, err := s.scalarSpan(v, b.flow)
			if err != nil {
				return nil, fmt.Errorf("field %s: %w", op.key, err)
			}
			if string(s.src[start:end]) != op.value {
				edits = append(edits, edit{start, end, op.value})
			}
		}
	}
	if len(inserts) > 0 {
		var ak, av *yaml.Node
		for _, a := range anchors {
			if ak, av = b.field(a); ak != nil {
				break
			}
		}
		var e edit
		var err error
		if ak == nil {
			// None of the anchors (a bare frontier: models and a cap):
			// the new fields go first.
			e, err = insertFirst(s, b, inserts)
		} else {
			e, err = insertAfter(s, b, ak, av, inserts)
		}
		if err != nil {
			return nil, err
		}
		edits = append(edits, e)
	}
	sort.Slice(edits, func(i, j int) bool {
		if edits[i].start != edits[j].start {
			return edits[i].start < edits[j].start
		}
		return edits[i].end < edits[j].end // an insert before a removal at the same place
	})
	for i := 1; i < len(edits); i++ {
		if edits[i].start < edits[i-1].end {
			return nil, fmt.Errorf("budget %s: overlapping edits", b.name)
		}
	}
	return edits, nil
}

// insertAfter puts new fields right after field ak (value av): as
// ", key: value" in flow style, or a line of each in block style.
func insertAfter(s *source, b *budgetNode, ak, av *yaml.Node, inserts []fieldOp) (edit, error) {
	_, vend, err := s.scalarSpan(av, b.flow)
	if err != nil {
		return edit{}, fmt.Errorf("field %s: %w", ak.Value, err)
	}
	var text strings.Builder
	if b.flow {
		for _, op := range inserts {
			fmt.Fprintf(&text, ", %s: %s", op.key, op.value)
		}
		return edit{vend, vend, text.String()}, nil
	}
	// Keys of a block mapping share the column of its first key.
	indent := strings.Repeat(" ", b.mapping.Content[0].Column-1)
	nl := s.newline(vend)
	at := s.lineEnd(vend)
	lastUnterminated := at == len(s.src)
	if !lastUnterminated {
		at++ // after the newline
	}
	for i, op := range inserts {
		if lastUnterminated || i > 0 {
			text.WriteString(nl)
		}
		fmt.Fprintf(&text, "%s%s: %s", indent, op.key, op.value)
	}
	if !lastUnterminated {
		// The anchor line ended with a line break, so does the last new line
		// (also at the end of the file: its final newline stays).
		text.WriteString(nl)
	}
	return edit{at, at, text.String()}, nil
}

// insertFirst puts new fields before b's first field: "key: value, " in flow
// style, or a line of each at the mapping's indentation in block style (not
// when the first field shares its line with a list marker, which the fields
// would then leave).
func insertFirst(s *source, b *budgetNode, inserts []fieldOp) (edit, error) {
	if len(b.mapping.Content) == 0 {
		return edit{}, fmt.Errorf("budget %s: an empty mapping is not edited; add its fields by hand", b.name)
	}
	first := b.mapping.Content[0]
	at, err := s.offset(first.Line, first.Column)
	if err != nil {
		return edit{}, err
	}
	var text strings.Builder
	if b.flow {
		for _, op := range inserts {
			fmt.Fprintf(&text, "%s: %s, ", op.key, op.value)
		}
		return edit{at, at, text.String()}, nil
	}
	lstart := s.lines[first.Line-1]
	indent := string(s.src[lstart:at])
	if strings.Trim(indent, " ") != "" {
		return edit{}, fmt.Errorf("line %d: budget %s's first field shares its line with a list marker; add %s by hand", first.Line, b.name, inserts[0].key)
	}
	nl := s.newline(at)
	for _, op := range inserts {
		fmt.Fprintf(&text, "%s%s: %s%s", indent, op.key, op.value, nl)
	}
	return edit{lstart, lstart, text.String()}, nil
}

func removeEdit(s *source, b *budgetNode, k, v *yaml.Node) (edit, error) {
	kstart, err := s.offset(k.Line, k.Column)
	if err != nil {
		return edit{}, err
	}
	_, vend, err := s.scalarSpan(v, b.flow)
	if err != nil {
		return edit{}, err
	}
	if !b.flow {
		lstart := s.lines[k.Line-1]
		if strings.TrimLeft(string(s.src[lstart:kstart]), " ") != "" {
			return edit{}, fmt.Errorf("line %d: field shares its line with a list marker; remove it by hand", k.Line)
		}
		lend := s.lineEnd(vend)
		if lend < len(s.src) {
			lend++
		}
		return edit{lstart, lend, ""}, nil
	}
	// Flow: drop ", key: value" (or "key: value, " when it comes first).
	i := kstart
	for i > 0 && (s.src[i-1] == ' ' || s.src[i-1] == '\t') {
		i--
	}
	if i > 0 && s.src[i-1] == ',' {
		return edit{i - 1, vend, ""}, nil
	}
	j := vend
	for j < len(s.src) && (s.src[j] == ' ' || s.src[j] == '\t') {
		j++
	}
	if j < len(s.src) && s.src[j] == ',' {
		j++
		for j < len(s.src) && s.src[j] == ' ' {
			j++
		}
		return edit{kstart, j, ""}, nil
	}
	return edit{}, fmt.Errorf("line %d: cannot remove the only field of a flow mapping", k.Line)
}

func apply(src []byte, edits []edit) []byte {
	out := make([]byte, 0, len(src)+64)
	prev := 0
	for _, e := range edits {
		out = append(out, src[prev:e.start]...)
		out = append(out, e.text...)
		prev = e.end
	}
	return append(out, src[prev:]...)
}

// changedLines counts lines that differ between a and b, assuming the edit
// kept every other line (it does: edits never span lines they do not own).
// It is the size of a minimal line diff: removed plus added lines.
func changedLines(a, b []byte) int {
	la := strings.Split(string(a), "\n")
	lb := strings.Split(string(b), "\n")
	p := 0
	for p < len(la) && p < len(lb) && la[p] == lb[p] {
		p++
	}
	q := 0
	for q < len(la)-p && q < len(lb)-p && la[len(la)-1-q] == lb[len(lb)-1-q] {
		q++
	}
	return max(len(la)-p-q, len(lb)-p-q)
}
