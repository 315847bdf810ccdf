package service

import (
	"context"
	"fmt"
	"sync"

	"github.com/budgetgen/budgetgen/internal/ratelimit/settings"
	"github.com/budgetgen/budgetgen/internal/ratelimit/source"
)

// startBudgetMap loads the budget map once (a bad map at start is an error:
// counting without it would split budgets silently) and polls it after.
func startBudgetMap(ctx context.Context, s settings.Settings, a *source.Applier, wg *sync.WaitGroup) error {
	bm := &source.BudgetMapFile{Path: s.BudgetMapPath, Interval: s.ConfigPollInterval}
	if err := bm.Load(a); err != nil {
		return fmt.Errorf("initial budget map: %w", err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = bm.Run(ctx, a) }()
	return nil
}

// startExtraFiles serves the config directory's domains (agentgateway's,
// which no xDS server sends) next to the xDS config. Each source is
// validated on its own: a bad file keeps the last good files and never drops
// the xDS config.
func startExtraFiles(ctx context.Context, s settings.Settings, a *source.Applier, wg *sync.WaitGroup) error {
	files := &source.Files{Dir: s.DirOptions(), Interval: s.ConfigPollInterval}
	if err := files.Load(a); err != nil && !s.ForceStartWithoutInitialConfig {
		return fmt.Errorf("initial config files: %w", err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = files.Run(ctx, a) }()
	return nil
}
