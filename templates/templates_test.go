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

// TestWithShadowSince: every shadow budget of every template gets the date,
// the result still loads, and comments stay.
func TestWithShadowSince(t *testing.T) {
	for _, name := range Names() {
		data, _ := Get(name)
		out, err := WithShadowSince(data, "2026-10-16")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		bs, err := spec.Load(out, name+".yaml")
		if err != nil {
			t.Fatalf("%s with shadowSince: %v\n%s", name, err, out)
		}
		for _, ref := range bs.Refs() {
			if !ref.Rollout.Enforced() && ref.Rollout.ShadowSince != "2026-10-16" {
				t.Errorf("%s: budget %s has shadowSince %q", name, ref.Name, ref.Rollout.ShadowSince)
			}
		}
		for _, line := range strings.Split(string(data), "\n") {
			if !strings.Contains(string(out), line) {
				t.Errorf("%s: line %q lost", name, line)
			}
		}
		again, _ := WithShadowSince(out, "2030-01-01")
		if string(again) != string(out) {
			t.Errorf("%s: a second pass changed an existing shadowSince", name)
		}
	}
	// An enforced budget and a flow-style one.
	in := "spec:\n  budgets:\n    - name: a\n      tokensPerDay: 1\n      mode: enforce\n"
	if out, err := WithShadowSince([]byte(in), "2026-10-16"); err != nil || string(out) != in {
		t.Errorf("enforced budget changed: %v %q", err, out)
	}
	if _, err := WithShadowSince([]byte("spec:\n  budgets:\n    - {name: a, tokensPerDay: 1}\n"), "2026-10-16"); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("flow style: %v", err)
	}
}
