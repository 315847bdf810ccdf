package cli

import (
	"github.com/budgetgen/budgetgen/pkg/manifest"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// renderForDrift returns what render produces now from bs, as objects for
// BG008. nil until pkg/render lands: drift is then not checked.
func renderForDrift(bs *spec.BudgetSet) ([]*manifest.Object, error) {
	return nil, nil
}
