package cli

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/internal/safetext"
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

// configMapMaxBytes is what a ConfigMap's data may hold in all
// (https://kubernetes.io/docs/concepts/configuration/configmap/: "cannot
// exceed 1 MiB"); the budget map is deployed in one (budgetgen-budget-map).
const configMapMaxBytes = 1 << 20

// warnBudgetMapSize warns when the budget map cannot be deployed the
// documented way: the API server refuses a ConfigMap over 1 MiB, so the
// service would keep the previous map (or never start). The file itself is
// still written: a service reading it from another volume can load up to
// budgetmap.MaxFileSize.
func warnBudgetMapSize(e *env, path string, data []byte) {
	if len(data) <= configMapMaxBytes {
		return
	}
	_, _ = fmt.Fprintf(e.stderr, "budgetgen render: warning: the budget map %s is %d bytes, more than a ConfigMap holds (1 MiB): the API server will refuse it as the ConfigMap budgetgen-budget-map; mount it into the service from another kind of volume (the service reads up to %d bytes)\n", // a warning, not the output
		safetext.Inline(path), len(data), budgetmap.MaxFileSize)
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
