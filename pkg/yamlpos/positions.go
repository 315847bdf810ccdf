package yamlpos

import "strings"

// Positions maps field paths ("spec.budgets[2].mode", "" for the document)
// to the position of their values, as Decode found them.
type Positions map[string]Pos

// Of is the position of path, or of its nearest ancestor that has one when
// the field itself is absent (a missing required field is reported where
// its parent is); the zero Pos when nothing is known (a value built in Go).
func (p Positions) Of(path string) Pos {
	for {
		if at, ok := p[path]; ok {
			return at
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			return p[""]
		}
		path = path[:i]
	}
}

// Join appends a field name to a path.
func Join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}
