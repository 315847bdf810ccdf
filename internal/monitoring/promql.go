package monitoring

import (
	"fmt"
	"sort"
	"strings"
)

// MetricNames returns the metric names a PromQL expression selects, sorted
// and without duplicates. It reads just enough of PromQL's lexical syntax
// (prometheus/promql/parser's lexer: strings, durations and numbers, label
// matchers, range brackets, keywords, grouping lists) to tell a series name
// from a function, an aggregation, a keyword, a label or a duration; a
// {__name__="x"} matcher names x. Grafana variables ($name, ${name},
// $__rate_interval) are placeholders. Unbalanced brackets or an unterminated
// string are an error naming the offset.
func MetricNames(expr string) ([]string, error) {
	l := lexer{s: expr, names: map[string]bool{}}
	if err := l.run(); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(l.names))
	for n := range l.names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// keywords are PromQL's keywords (the parser's lexer: binary operators,
// modifiers, aggregation operators, Inf and NaN), never series names;
// grouping ones take a parenthesized label list.
var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true,
	"sum": true, "avg": true, "count": true, "min": true, "max": true, "group": true, "stddev": true, "stdvar": true,
	"topk": true, "bottomk": true, "count_values": true, "quantile": true, "limitk": true, "limit_ratio": true,
}

var grouping = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

type lexer struct {
	s      string
	i      int
	parens int
	names  map[string]bool
}

func (l *lexer) run() error {
	for l.i < len(l.s) {
		c := l.s[l.i]
		var err error
		switch {
		case c == '"' || c == '\'' || c == '`':
			_, err = l.str()
		case c == '{':
			err = l.matchers()
		case c == '[':
			err = l.skipTo(']')
		case c == '$':
			l.variable()
		case isDigit(c) || (c == '.' && l.i+1 < len(l.s) && isDigit(l.s[l.i+1])):
			l.number()
		case isNameStart(c):
			err = l.name()
		case c == '}' || c == ']':
			return fmt.Errorf("offset %d: unbalanced %q", l.i, c)
		case c == '(':
			l.parens++
			l.i++
		case c == ')':
			if l.parens--; l.parens < 0 {
				return fmt.Errorf("offset %d: unbalanced ')'", l.i)
			}
			l.i++
		default:
			l.i++
		}
		if err != nil {
			return err
		}
	}
	if l.parens != 0 {
		return fmt.Errorf("%d unclosed '('", l.parens)
	}
	return nil
}

// name reads an identifier and decides what it is.
func (l *lexer) name() error {
	start := l.i
	for l.i < len(l.s) && isNameChar(l.s[l.i]) {
		l.i++
	}
	word := l.s[start:l.i]
	next := l.peek()
	lower := strings.ToLower(word)
	switch {
	case grouping[lower] && next == '(':
		l.i = l.nextIndex()
		return l.skipTo(')')
	case keywords[lower]:
	case next == '(': // a function or an aggregation
	default:
		l.names[word] = true
	}
	return nil
}

// matchers reads a {...} label matcher list; only __name__="x" names a series.
func (l *lexer) matchers() error {
	open := l.i
	l.i++
	for l.i < len(l.s) {
		c := l.s[l.i]
		switch {
		case c == '}':
			l.i++
			return nil
		case c == '"' || c == '\'' || c == '`':
			if _, err := l.str(); err != nil {
				return err
			}
		case isNameStart(c):
			start := l.i
			for l.i < len(l.s) && isNameChar(l.s[l.i]) {
				l.i++
			}
			if l.s[start:l.i] == "__name__" && l.peek() == '=' {
				l.i = l.nextIndex() + 1
				if p := l.peek(); p == '"' || p == '\'' || p == '`' {
					l.i = l.nextIndex()
					v, err := l.str()
					if err != nil {
						return err
					}
					l.names[v] = true
				}
			}
		default:
			l.i++
		}
	}
	return fmt.Errorf("offset %d: unterminated label matchers", open)
}

// str reads a quoted string and returns its content (escapes kept).
func (l *lexer) str() (string, error) {
	q, open := l.s[l.i], l.i
	l.i++
	for l.i < len(l.s) {
		c := l.s[l.i]
		if c == '\\' && q != '`' {
			l.i += 2
			continue
		}
		l.i++
		if c == q {
			return l.s[open+1 : l.i-1], nil
		}
	}
	return "", fmt.Errorf("offset %d: unterminated string", open)
}

// skipTo skips past the bracket closing the one at l.i (or the next one),
// strings included.
func (l *lexer) skipTo(closer byte) error {
	open := l.i
	opener := l.s[l.i]
	depth := 0
	for l.i < len(l.s) {
		switch c := l.s[l.i]; c {
		case '"', '\'', '`':
			if _, err := l.str(); err != nil {
				return err
			}
			continue
		case opener:
			depth++
		case closer:
			depth--
			if depth == 0 {
				l.i++
				return nil
			}
		}
		l.i++
	}
	return fmt.Errorf("offset %d: unbalanced %q", open, opener)
}

// variable skips a Grafana variable ($name or ${name...}) and the name
// characters glued to it: whatever it expands to is unknown here.
func (l *lexer) variable() {
	l.i++
	if l.i < len(l.s) && l.s[l.i] == '{' {
		if end := strings.IndexByte(l.s[l.i:], '}'); end >= 0 {
			l.i += end + 1
		}
	}
	for l.i < len(l.s) && isNameChar(l.s[l.i]) {
		l.i++
	}
}

// number skips a number or a duration (1, 0.5, 1e-3, 0x1f, 5m, 1h30m).
func (l *lexer) number() {
	for l.i < len(l.s) {
		c := l.s[l.i]
		if isNameChar(c) || c == '.' {
			l.i++
			continue
		}
		if (c == '+' || c == '-') && (l.s[l.i-1] == 'e' || l.s[l.i-1] == 'E') && !strings.HasPrefix(strings.ToLower(l.s[:l.i]), "0x") {
			l.i++
			continue
		}
		return
	}
}

// nextIndex is the index of the next non-space byte from l.i.
func (l *lexer) nextIndex() int {
	j := l.i
	for j < len(l.s) && (l.s[j] == ' ' || l.s[j] == '\t' || l.s[j] == '\n' || l.s[j] == '\r') {
		j++
	}
	return j
}

// peek is the next non-space byte, 0 at the end.
func (l *lexer) peek() byte {
	if j := l.nextIndex(); j < len(l.s) {
		return l.s[j]
	}
	return 0
}

func isDigit(c byte) bool     { return c >= '0' && c <= '9' }
func isNameStart(c byte) bool { return c == '_' || c == ':' || (c|0x20) >= 'a' && (c|0x20) <= 'z' }
func isNameChar(c byte) bool  { return isNameStart(c) || isDigit(c) }
