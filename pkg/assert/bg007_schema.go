package assert

import (
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleSchema: an object Envoy Gateway's API server would reject (schema or
// CEL) is never applied, and its budgets never exist. Checked offline with
// EG's own CRDs through the injected Validator (internal/crdvalidate in the CLI).
var ruleSchema = &Rule{
	ID:       "BG007",
	Name:     "schema",
	Doc:      "objects of Envoy Gateway and Gateway API kinds are valid against Envoy Gateway's CRD schema and CEL rules",
	Severity: Error,
	Check: func(p *Pass) error {
		if p.Options.Validator == nil {
			return nil
		}
		for _, o := range p.Index.Objects {
			if g := o.Group(); g != GroupEG && g != GroupGateway {
				continue
			}
			errs, err := p.Options.Validator.Validate(p.Context, o)
			if err != nil {
				return err
			}
			for _, fe := range errs {
				n := NodeAt(o.Node, fe.Path)
				p.Report(o, n, fe.Path, "%s", fe.Message)
			}
		}
		return nil
	},
}

// NodeAt finds the node at a field path such as spec.rules[0].limit.unit.
// It returns the deepest node it reached, so a path to a missing field points
// at its parent.
func NodeAt(root *yaml.Node, path string) *yaml.Node {
	n := root
	for _, part := range strings.Split(path, ".") {
		if part == "" {
			continue
		}
		name, rest, _ := strings.Cut(part, "[")
		if name != "" {
			next := manifest.Get(n, name)
			if next == nil {
				return n
			}
			n = next
		}
		for rest != "" {
			idx, after, ok := strings.Cut(rest, "]")
			if !ok {
				return n
			}
			i, err := strconv.Atoi(idx)
			items := manifest.Items(n)
			if err != nil || i < 0 || i >= len(items) {
				return n
			}
			n = items[i]
			rest = strings.TrimPrefix(after, "[")
		}
	}
	return n
}
