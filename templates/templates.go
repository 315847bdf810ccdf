// Package templates holds the starter BudgetSet specs that `budgetgen init`
// writes, embedded into the binary.
package templates

import (
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

//go:embed *.yaml
var files embed.FS

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
