package cli

import (
	"fmt"
	"os"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/internal/rlsconfig"
	"github.com/budgetgen/budgetgen/pkg/render"
)

// addRateLimitConfigFlag registers render's --ratelimit-config.
func addRateLimitConfigFlag(cmd *cobra.Command, dir *string) {
	cmd.Flags().StringVar(dir, "ratelimit-config", "", "also write the rate limit service config of the rendered policies into `DIR` (Envoy Gateway's domains as it derives them over xDS, for review; agentgateway's, which the service must be given), one YAML per domain in the reference service's runtime format (use it as RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config to run without Envoy Gateway)")
	_ = cmd.MarkFlagDirname("ratelimit-config")
}

// rateLimitConfigFiles derives the files for --ratelimit-config from the
// rendered BackendTrafficPolicies; nil when dir is empty.
func rateLimitConfigFiles(res *render.Result, dir string) (map[string][]byte, error) {
	if dir == "" {
		return nil, nil
	}
	var btps []*egv1a1.BackendTrafficPolicy
	for _, o := range res.Objects {
		if p, ok := o.Object.(*egv1a1.BackendTrafficPolicy); ok {
			btps = append(btps, p)
		}
	}
	cfgs, err := rlsconfig.Configs(btps)
	if err != nil {
		return nil, fmt.Errorf("derive rate limit service config: %w", err)
	}
	cfgs = append(cfgs, res.AgentgatewayConfigs...)
	files, err := rlsconfig.Files(cfgs)
	if err != nil {
		return nil, fmt.Errorf("derive rate limit service config: %w", err)
	}
	return files, nil
}

// stageRateLimitConfig stages files for dir (internal/atomicfile), removing
// on commit files budgetgen wrote earlier for domains no longer rendered. A
// nil *Staged (dir empty) commits and aborts as a no-op.
func stageRateLimitConfig(dir string, files map[string][]byte) (*atomicfile.Staged, error) {
	if dir == "" {
		return nil, nil
	}
	if info, err := os.Stat(dir); err == nil && !info.IsDir() {
		return nil, usageError("render: --ratelimit-config %s: not a directory", dir)
	}
	st, err := atomicfile.StageDir(dir, files, rateLimitFileOpts)
	if err != nil {
		return nil, failure(err)
	}
	return st, nil
}

func commitRateLimitConfig(st *atomicfile.Staged) error {
	if err := st.Commit(); err != nil {
		return failure(err)
	}
	return nil
}
