package source

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
)

// ratelimit_config_rules is "rate limits in the active config"
// (docs/monitoring.md): the merged config of every source, not the last
// source loaded, and never the budget map's entry count.
func TestConfigRulesGaugeCountsTheActiveConfig(t *testing.T) {
	dir := t.TempDir()
	cfgDir := filepath.Join(dir, "cfg")
	if err := os.Mkdir(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeDir(t, cfgDir, "agw.yaml", agwFile) // 2 limits
	mapPath := filepath.Join(dir, "map.yaml")
	writeDir(t, dir, "map.yaml", mapFile) // 3 entries
	m := metrics.New(nil)
	s := &sink{}
	a := &Applier{Sink: s, Metrics: m, Logger: quiet()}
	rules := func() int { return int(testutil.ToFloat64(m.ConfigRules)) }
	active := func() int { c, _ := s.get(); return len(c.Limits()) }

	bm := &BudgetMapFile{Path: mapPath}
	if err := bm.Load(a); err != nil {
		t.Fatal(err)
	}
	if got := rules(); got != 0 {
		t.Errorf("budget map loaded before any config: rules = %d, want 0", got)
	}
	if err := (&Files{Dir: config.DirOptions{Root: cfgDir}}).Load(a); err != nil {
		t.Fatal(err)
	}
	if err := a.ApplyProto(t.Context(), egProto("gw/s-gw1")); err != nil { // 1 limit
		t.Fatal(err)
	}
	if got, want := rules(), active(); got != want || want != 3 {
		t.Errorf("files and xDS merged: rules = %d, want %d (the active config's limits; 3)", got, want)
	}
	// A reloaded budget map (2 entries) changes no limit count.
	writeDir(t, dir, "map.yaml", mapFile[:strings.Index(mapFile, "  - domain: gw/s-gw1")])
	if err := bm.Load(a); err != nil {
		t.Fatal(err)
	}
	if got, want := rules(), active(); got != want {
		t.Errorf("after a budget map reload: rules = %d, want %d", got, want)
	}
}
