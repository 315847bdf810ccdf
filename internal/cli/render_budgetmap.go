package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// addBudgetMapFlag registers render's --budget-map.
func addBudgetMapFlag(cmd *cobra.Command, path *string) {
	cmd.Flags().StringVar(path, "budget-map", "", "also write the budget map (which rate limit rule is which budget, on which Gateway) to `FILE`; give it to the ratelimit service (--budget-map, BUDGET_MAP_PATH) so a budget's principal is counted once across Gateways")
	_ = cmd.MarkFlagFilename("budget-map", "yaml", "yml")
}

// budgetMapFile encodes the budget map; nil when path is empty. It checks the
// encoding loads back, so render never writes a map the service would reject.
func budgetMapFile(bs *spec.BudgetSet, path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	data, err := budgetmap.Encode(render.BudgetMap(bs))
	if err != nil {
		return nil, err
	}
	if _, err := budgetmap.Load(data, path); err != nil {
		return nil, fmt.Errorf("rendered budget map does not load: %w", err)
	}
	return data, nil
}

// writeBudgetMap writes the map all or nothing.
func writeBudgetMap(path string, data []byte) error {
	if path == "" {
		return nil
	}
	if err := atomicfile.WriteFile(path, data, atomicfile.Options{}); err != nil {
		return failure(err)
	}
	return nil
}
