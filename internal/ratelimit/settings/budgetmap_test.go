package settings

import (
	"io"
	"testing"
)

// BUDGET_MAP_PATH and CONFIG_DIR come from env; --budget-map and
// --config-dir win over them.
func TestBudgetMapAndConfigDirSettings(t *testing.T) {
	env := envOf(map[string]string{"BUDGET_MAP_PATH": "/etc/b/map.yaml", "CONFIG_DIR": "/etc/b/config"})
	s, err := Load(nil, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.BudgetMapPath != "/etc/b/map.yaml" || s.DirOptions().Dir() != "/etc/b/config" {
		t.Errorf("from env: map %q dir %q", s.BudgetMapPath, s.DirOptions().Dir())
	}
	s, err = Load([]string{"--budget-map", "m.yaml", "--config-dir", "cfg"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.BudgetMapPath != "m.yaml" || s.DirOptions().Dir() != "cfg" {
		t.Errorf("flags: map %q dir %q", s.BudgetMapPath, s.DirOptions().Dir())
	}
	s, err = Load(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.BudgetMapPath != "" {
		t.Errorf("default budget map = %q, want none (behaviour as before)", s.BudgetMapPath)
	}
}
