package source

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// budgetMapSource labels budget map loads in logs and metrics.
const budgetMapSource = "budget_map"

// ScopeFromMap returns the scope function of a validated budget map: a limit
// whose domain and config path the map names as a token budget is counted in
// the entry's bucket; kill switch rules and unnamed limits keep their own
// counters. Every limit the map names (kill switches too) gets its Budget.
func ScopeFromMap(m *budgetmap.Map) config.ScopeFunc {
	ix := budgetmap.NewIndex(m)
	return func(domain string, path []config.PathEntry) config.Resolved {
		p := make([]budgetmap.DescriptorEntry, len(path))
		for i, e := range path {
			p[i] = budgetmap.DescriptorEntry{Key: e.Key, Value: e.Value}
		}
		e := ix.Lookup(domain, p)
		if e == nil {
			return config.Resolved{}
		}
		r := config.Resolved{Budget: budgetOf(e)}
		if e.Kind == budgetmap.KindTokens {
			r.Scope = &config.Scope{Bucket: e.Bucket, Principal: e.OverridePrincipal, Fixed: e.OverridePrincipal != ""}
		}
		return r
	}
}

// unmatchedEntries lists the entries of m whose domain c holds but that no
// limit of c resolves to (by ScopeFromMap's longest-prefix rule): rules
// the map names that the config no longer has, so their budget is not
// applied. Entries of domains c lacks are left out: the map is shared by
// the Deployments of both gateways, each serving its own domains.
func unmatchedEntries(m *budgetmap.Map, c *config.Config) []*budgetmap.Entry {
	if m == nil || c.Empty() {
		return nil
	}
	ix := budgetmap.NewIndex(m)
	hit := map[*budgetmap.Entry]bool{}
	for _, l := range c.Limits() {
		p := make([]budgetmap.DescriptorEntry, len(l.Path))
		for i, e := range l.Path {
			p[i] = budgetmap.DescriptorEntry{Key: e.Key, Value: e.Value}
		}
		if e := ix.Lookup(l.Domain, p); e != nil {
			hit[e] = true
		}
	}
	domains := map[string]bool{}
	for _, d := range c.Domains() {
		domains[d] = true
	}
	var out []*budgetmap.Entry
	for i := range m.Entries {
		if e := &m.Entries[i]; domains[e.Domain] && !hit[e] {
			out = append(out, e)
		}
	}
	return out
}

// warnUnmatched logs each entry unmatchedEntries found.
func warnUnmatched(log *slog.Logger, entries []*budgetmap.Entry) {
	for _, e := range entries {
		path := make([]string, len(e.Descriptor))
		for i, d := range e.Descriptor {
			path[i] = d.Key + "=" + d.Value
		}
		log.Warn("budget map entry matches no rule of its domain in the config; that rule counts outside its budget (render and apply again)",
			"domain", e.Domain, "descriptor", strings.Join(path, ","), "budget", e.Budget, "bucket", e.Bucket,
			"gateway", e.Gateway.Kind+":"+e.Gateway.Namespace+"/"+e.Gateway.Name)
	}
}

// budgetOf is the config's view of a map entry.
func budgetOf(e *budgetmap.Entry) *config.Budget {
	b := &config.Budget{Name: e.Budget, Kind: e.Kind, Window: e.Window, Mode: e.Mode, Bucket: e.Bucket, Measure: e.Measure,
		Gateway: e.Gateway.Kind + ":" + e.Gateway.Namespace + "/" + e.Gateway.Name}
	if r := e.Reserve; r != nil {
		b.Reserve = config.Reserve{Tokens: uint64(max(r.Tokens, 0)), Auto: r.Auto, Initial: uint64(max(r.Initial, 0))}
	}
	return b
}

// BudgetMapFile watches a budget map file by polling, like Files, and applies
// every changed, valid version to an Applier. A missing or invalid file is
// logged and counted, and the last good map stays in force.
type BudgetMapFile struct {
	Path string
	// Interval between polls, default DefaultPollInterval.
	Interval time.Duration

	last [32]byte
	seen bool
}

// Load reads the file and applies it if it changed since the last call.
func (b *BudgetMapFile) Load(a *Applier) error {
	data, err := readBounded(b.Path)
	var sum [32]byte
	if err != nil {
		sum = sha256.Sum256([]byte("error:" + err.Error()))
	} else {
		sum = sha256.Sum256(data)
	}
	if b.seen && sum == b.last {
		return err
	}
	b.last, b.seen = sum, true
	var m *budgetmap.Map
	if err == nil {
		m, err = budgetmap.Load(data, b.Path)
	}
	if err == nil {
		err = a.setBudgetMap(ScopeFromMap(m), m)
	}
	if err != nil {
		err = fmt.Errorf("budget map: %w", err)
		a.Metrics.ConfigLoaded(budgetMapSource, err)
		a.logger().Error("budget map rejected; keeping the last good one", "err", err)
		return err
	}
	// The map scopes limits, it adds none: SetBudgetMap set the rules gauge
	// to the installed config's limits, not the map's entries.
	a.Metrics.ConfigLoaded(budgetMapSource, nil)
	a.logger().Info("budget map loaded", "path", b.Path, "entries", len(m.Entries), "budget_set", m.BudgetSet)
	return nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read-only
	data, err := io.ReadAll(io.LimitReader(f, budgetmap.MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	return data, nil // Load rejects an oversized file with its name
}

// Run polls until ctx is done.
func (b *BudgetMapFile) Run(ctx context.Context, a *Applier) error {
	iv := b.Interval
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
			_ = b.Load(a)
		}
	}
}
