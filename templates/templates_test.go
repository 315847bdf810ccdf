package templates

import (
	"slices"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// TestTemplatesLoadAndRender: every starter spec is valid, renders, and points
// editors at the JSON Schema.
func TestTemplatesLoadAndRender(t *testing.T) {
	names := Names()
	if !slices.Contains(names, Default) || len(names) < 2 {
		t.Fatalf("templates = %v", names)
	}
	for _, name := range names {
		data, err := Get(name)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(data), "# yaml-language-server: $schema=") {
			t.Errorf("%s does not start with a yaml-language-server schema comment", name)
		}
		bs, err := spec.Load(data, name+".yaml")
		if err != nil {
			t.Fatalf("template %s: %v", name, err)
		}
		if _, err := render.Render(bs); err != nil {
			t.Errorf("template %s does not render: %v", name, err)
		}
	}
	if _, err := Get("nope"); err == nil || !strings.Contains(err.Error(), "available: ai-gateway, minimal") {
		t.Errorf("Get(nope) err = %v", err)
	}
}
