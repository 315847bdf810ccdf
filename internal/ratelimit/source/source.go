// Package source feeds configs to the decision engine: a polling file watcher
// over the reference's runtime directory now, and an apply hook for an xDS
// client (which calls ApplyProto). A rejected config never replaces the last
// good one; it is logged and counted.
package source

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// Sink receives validated configs; *engine.Engine implements it.
type Sink interface {
	SetConfig(*config.Config)
}

// Source delivers configs to an Applier until ctx ends.
type Source interface {
	// Name is the source's label in logs and metrics ("file", "xds").
	Name() string
	// Run blocks until ctx is done. It calls a.Apply for every load attempt.
	Run(ctx context.Context, a *Applier) error
}

// Applier installs configs into a Sink, keeping the last good one of each
// source, and reports every attempt. Several sources (xDS from Envoy Gateway,
// files holding agentgateway's domains) are merged into the one config the
// Sink gets: each is validated on its own, and a rejected update of one never
// drops the other's config. A budget map (SetBudgetMap) scopes the limits it
// names. Safe for concurrent use.
type Applier struct {
	Sink    Sink
	Metrics *metrics.Metrics // optional
	Logger  *slog.Logger     // default slog.Default()
	// OnLoaded, optional, is called after every successful install (health).
	OnLoaded func(*config.Config)

	mu     sync.Mutex
	loaded bool
	parts  map[string]*config.Config
	// held are configs refused only because they collide with another
	// source's (the same domain in both), by source. Each is tried again
	// whenever another source installs a config: its own source may never
	// send it again (the files' poll reloads only changed files).
	held  map[string]*config.Config
	scope config.ScopeFunc
	// bmap is the budget map scope came from, when set by a BudgetMapFile:
	// every install reports its entries the config does not match.
	bmap *budgetmap.Map
}

func (a *Applier) logger() *slog.Logger {
	if a.Logger == nil {
		return slog.Default()
	}
	return a.Logger
}

// Apply installs c as source's config when err is nil; otherwise logs and
// counts the rejection and keeps the current config. It returns err
// unchanged, or the merge error when c cannot join the other sources'
// configs (the same domain in two sources), in which case c is rejected too,
// but held: it is installed as soon as another source's install ends the
// collision.
func (a *Applier) Apply(source string, c *config.Config, err error) error {
	log := a.logger()
	if err == nil && c == nil {
		err = fmt.Errorf("%s: no config", source)
	}
	if err != nil {
		a.mu.Lock()
		delete(a.held, source) // the source has moved past it
		a.mu.Unlock()
		a.Metrics.ConfigLoaded(source, err)
		log.Error("config rejected; keeping the last good config", "source", source, "err", err)
		return err
	}
	a.mu.Lock()
	merged, err := a.mergeLocked(source, c)
	if err != nil {
		if a.held == nil {
			a.held = map[string]*config.Config{}
		}
		a.held[source] = c
		a.mu.Unlock()
		err = fmt.Errorf("%s: merge with the other config sources: %w", source, err)
		a.Metrics.ConfigLoaded(source, err)
		log.Error("config rejected; keeping the last good config", "source", source, "err", err)
		return err
	}
	if a.parts == nil {
		a.parts = map[string]*config.Config{}
	}
	a.parts[source] = c
	delete(a.held, source)
	var retried []string
	var retriedCfgs []*config.Config
	merged, retried, retriedCfgs = a.installHeldLocked(merged)
	a.Sink.SetConfig(merged)
	a.loaded = true
	// ratelimit_config_rules counts the merged config's limits, whichever
	// source loaded last.
	a.Metrics.ConfigInstalled(len(merged.Limits()))
	unmatched := a.unmatchedLocked(merged)
	a.mu.Unlock()
	warnUnmatched(log, unmatched)
	a.Metrics.ConfigLoaded(source, nil)
	log.Info("config loaded", "source", source, "domains", len(merged.Domains()), "rules", len(merged.Limits()), "files", merged.Sources(), "budget_scoped", merged.Scoped())
	for _, n := range c.NotApplied() {
		log.Warn("config key not applied", "source", source, "detail", n)
	}
	for i, r := range retried {
		a.Metrics.ConfigLoaded(r, nil)
		log.Info("config loaded: its conflict with another source is gone", "source", r, "files", retriedCfgs[i].Sources())
		for _, n := range retriedCfgs[i].NotApplied() {
			log.Warn("config key not applied", "source", r, "detail", n)
		}
	}
	if a.OnLoaded != nil {
		a.OnLoaded(merged)
	}
	return nil
}

// installHeldLocked tries each held config again (sources in name order)
// on top of merged, and makes each that now merges its source's part. It
// returns the config to install, and the sources it installed with their
// configs.
func (a *Applier) installHeldLocked(merged *config.Config) (*config.Config, []string, []*config.Config) {
	if len(a.held) == 0 {
		return merged, nil, nil
	}
	names := make([]string, 0, len(a.held))
	for n := range a.held {
		names = append(names, n)
	}
	sort.Strings(names)
	var (
		done []string
		cfgs []*config.Config
	)
	for _, n := range names {
		c := a.held[n]
		m, err := a.mergeLocked(n, c)
		if err != nil {
			continue
		}
		a.parts[n] = c
		delete(a.held, n)
		merged = m
		done, cfgs = append(done, n), append(cfgs, c)
	}
	return merged, done, cfgs
}

// mergeLocked builds the config the Sink gets when source's part becomes c
// (nil: keep the current parts). With one part and no budget map it is that
// part itself, exactly as before sources could be merged.
func (a *Applier) mergeLocked(source string, c *config.Config) (*config.Config, error) {
	names := make([]string, 0, len(a.parts)+1)
	for n := range a.parts {
		if n != source {
			names = append(names, n)
		}
	}
	if c != nil {
		names = append(names, source)
	}
	sort.Strings(names)
	parts := make([]*config.Config, 0, len(names))
	for _, n := range names {
		if n == source && c != nil {
			parts = append(parts, c)
		} else {
			parts = append(parts, a.parts[n])
		}
	}
	if len(parts) == 1 && a.scope == nil {
		return parts[0], nil
	}
	return config.Merge(a.scope, parts...)
}

// unmatchedLocked sets the unmatched-entries gauge for merged, about to be
// installed, and returns the entries to warn of.
func (a *Applier) unmatchedLocked(merged *config.Config) []*budgetmap.Entry {
	u := unmatchedEntries(a.bmap, merged)
	a.Metrics.BudgetMapUnmatchedEntries(len(u))
	return u
}

// SetBudgetMap scopes the limits a budget map names (nil: none) and
// reinstalls the merged config. It fails, changing nothing, when the current
// configs cannot be rebuilt with it.
func (a *Applier) SetBudgetMap(scope config.ScopeFunc) error {
	return a.setBudgetMap(scope, nil)
}

// setBudgetMap is SetBudgetMap with the map scope came from (nil: not
// known), whose entries every install then checks against the config.
func (a *Applier) setBudgetMap(scope config.ScopeFunc, m *budgetmap.Map) error {
	a.mu.Lock()
	prevScope, prevMap := a.scope, a.bmap
	a.scope, a.bmap = scope, m
	if len(a.parts) == 0 {
		a.mu.Unlock()
		return nil
	}
	merged, err := a.mergeLocked("", nil)
	if err != nil {
		a.scope, a.bmap = prevScope, prevMap
		a.mu.Unlock()
		return err
	}
	a.Sink.SetConfig(merged)
	a.Metrics.ConfigInstalled(len(merged.Limits()))
	unmatched := a.unmatchedLocked(merged)
	a.mu.Unlock()
	warnUnmatched(a.logger(), unmatched)
	a.logger().Info("budget map applied", "domains", len(merged.Domains()), "rules", len(merged.Limits()), "budget_scoped", merged.Scoped())
	if a.OnLoaded != nil {
		a.OnLoaded(merged)
	}
	return nil
}

// Loaded reports whether any config was installed.
func (a *Applier) Loaded() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.loaded
}

// ApplyProto builds a config from xDS resources and installs it; its
// signature matches the xDS client's apply callback. An invalid set returns
// the error (the client NACKs it) and installs nothing.
func (a *Applier) ApplyProto(_ context.Context, cfgs []*rlsconfv3.RateLimitConfig) error {
	c, err := config.FromProto(cfgs)
	return a.Apply("xds", c, err)
}

// DefaultPollInterval is how often Files re-reads the directory.
const DefaultPollInterval = time.Second

// Files watches a runtime directory by polling: every Interval it reads all
// files and reloads when their names or contents changed. Polling (rather
// than inotify) sees Kubernetes ConfigMap symlink swaps and editors' rename
// dances the same way, at the cost of reading a few small files a second.
type Files struct {
	Dir config.DirOptions
	// Interval between polls, default DefaultPollInterval.
	Interval time.Duration

	last [32]byte
	seen bool
}

// Name implements Source.
func (f *Files) Name() string { return "file" }

// Load reads and applies the directory once, if it changed since the last
// call. It returns the load error, if any.
func (f *Files) Load(a *Applier) error {
	files, err := config.ReadDir(f.Dir)
	if err != nil {
		sum := sha256.Sum256([]byte("error:" + err.Error()))
		if f.seen && sum == f.last {
			return err
		}
		f.last, f.seen = sum, true
		return a.Apply(f.Name(), nil, err)
	}
	h := sha256.New()
	for _, fl := range files {
		_, _ = fmt.Fprintf(h, "%d:%s%d:", len(fl.Name), fl.Name, len(fl.Data)) // hash.Hash.Write never returns an error
		h.Write(fl.Data)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	if f.seen && sum == f.last {
		return nil
	}
	f.last, f.seen = sum, true
	c, err := config.Load(files)
	if err != nil {
		err = fmt.Errorf("load config dir %s: %w", f.Dir.Dir(), err)
	}
	return a.Apply(f.Name(), c, err)
}

// Run implements Source: it polls until ctx is done.
func (f *Files) Run(ctx context.Context, a *Applier) error {
	iv := f.Interval
	if iv <= 0 {
		iv = DefaultPollInterval
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			_ = f.Load(a)
		}
	}
}
