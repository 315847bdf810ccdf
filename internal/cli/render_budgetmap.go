package cli

import (
	"fmt"
	"os"
	"path/filepath"

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

// stageBudgetMap stages the map next to its target (nil when no map is
// asked for); other files in that directory are left alone.
func stageBudgetMap(path string, data []byte) (*atomicfile.Staged, error) {
	if path == "" {
		return nil, nil
	}
	if info, err := os.Stat(path); err == nil && info.IsDir() {
		return nil, usageError("render: --budget-map %s: is a directory", path)
	}
	st, err := atomicfile.StageDir(filepath.Dir(path), map[string][]byte{filepath.Base(path): data}, atomicfile.Options{})
	if err != nil {
		return nil, failure(err)
	}
	return st, nil
}
