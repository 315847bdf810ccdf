// Package templates holds the starter BudgetSet specs that `budgetgen init`
// writes, embedded into the binary.
package templates

import (
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

//go:embed *.yaml
var files embed.FS

// gateways holds, per template, the platform objects (Gateway, AI Gateway
// route, SecurityPolicies) its budgets are checked against: budgetgen init
// writes them next to the spec, so the README's lifecycle (init, render,
// assert) passes before anything is edited.
//
//go:embed gateway/*.yaml
var gateways embed.FS

// Default is the template `budgetgen init` writes when none is named.
const Default = "minimal"

// Names lists the available templates, sorted.
func Names() []string {
	entries, _ := fs.ReadDir(files, ".") // the embedded root always lists
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	slices.Sort(names)
	return names
}

// Get returns a template's content by name.
func Get(name string) ([]byte, error) {
	if !slices.Contains(Names(), name) {
		return nil, fmt.Errorf("unknown template %q (available: %s)", name, strings.Join(Names(), ", "))
	}
	return files.ReadFile(name + ".yaml")
}

// Gateway returns the platform objects of a template (a YAML stream).
func Gateway(name string) ([]byte, error) {
	if !slices.Contains(Names(), name) {
		return nil, fmt.Errorf("unknown template %q (available: %s)", name, strings.Join(Names(), ", "))
	}
	return gateways.ReadFile("gateway/" + name + ".yaml")
}

// WithShadowSince returns a template with `shadowSince: day` added to every
// budget (and the frontier cap) that is in shadow mode and has none, so the
// first `budgetgen promote` a week later counts from the day the spec was
// written instead of refusing. The text is edited line by line (one line
// inserted after each budget's tokensPerDay), so comments and layout stay.
// day is a UTC date (YYYY-MM-DD).
func WithShadowSince(data []byte, day string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	if len(doc.Content) == 0 {
		return nil, fmt.Errorf("template: empty document")
	}
	specNode := mapValue(doc.Content[0], "spec")
	var budgets []*yaml.Node
	if seq := mapValue(specNode, "budgets"); seq != nil && seq.Kind == yaml.SequenceNode {
		budgets = append(budgets, seq.Content...)
	}
	if f := mapValue(specNode, "frontier"); f != nil {
		budgets = append(budgets, f)
	}
	type insert struct {
		after  int // 1-based line
		indent int
	}
	var ins []insert
	for _, b := range budgets {
		if b.Kind != yaml.MappingNode || mapValue(b, "shadowSince") != nil {
			continue
		}
		if m := mapValue(b, "mode"); m != nil && m.Value != "shadow" {
			continue
		}
		if b.Style&yaml.FlowStyle != 0 {
			return nil, fmt.Errorf("template: line %d: a flow-style budget; write it in block style", b.Line)
		}
		var key *yaml.Node
		for i := 0; i+1 < len(b.Content); i += 2 {
			if b.Content[i].Value == "tokensPerDay" {
				key = b.Content[i]
			}
		}
		if key == nil || b.Content[0].Line == 0 {
			return nil, fmt.Errorf("template: line %d: budget without tokensPerDay", b.Line)
		}
		ins = append(ins, insert{after: key.Line, indent: key.Column - 1})
	}
	lines := strings.SplitAfter(string(data), "\n")
	slices.SortFunc(ins, func(a, b insert) int { return b.after - a.after }) // bottom up: line numbers stay valid
	for _, in := range ins {
		if in.after > len(lines) {
			return nil, fmt.Errorf("template: line %d out of range", in.after)
		}
		line := strings.Repeat(" ", in.indent) + "shadowSince: " + day + "   # the UTC day shadow measurement started; promote counts 7 full days after it\n"
		lines = slices.Insert(lines, in.after, line)
	}
	return []byte(strings.Join(lines, "")), nil
}

// mapValue returns the value of key in a mapping node (nil when absent).
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}
