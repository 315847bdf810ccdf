package cli

import (
	"github.com/budgetgen/budgetgen/pkg/manifest"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// renderForDrift returns what render produces now from bs, as objects for
// BG008, read back through the same YAML reader as the committed files so
// both sides are compared as data.
func renderForDrift(bs *spec.BudgetSet) ([]*manifest.Object, error) {
	res, err := render.Render(bs)
	if err != nil {
		return nil, err
	}
	objs, err := manifest.Parse("<render>", res.YAML(), manifest.Options{})
	if err != nil {
		return nil, err
	}
	if objs == nil {
		objs = []*manifest.Object{} // non-nil: drift runs and reports committed leftovers
	}
	return objs, nil
}
