package render

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/rlsconfig"
	"github.com/budgetgen/budgetgen/pkg/budgetmap"
)

// TestAgentgatewayWindows renders budgets of every window shape on an
// agentgateway Gateway: the policy (in TestGolden too) has one descriptor
// per window, the rate limit config and the budget map match their goldens,
// and the config loads in our service with nothing refused or ignored.
func TestAgentgatewayWindows(t *testing.T) {
	bs := load(t, "testdata/agentgateway_windows.yaml")
	res, err := Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	var p *agentgateway.Policy
	for _, o := range res.Objects {
		if o.Kind == KindAgentgatewayPolicy {
			validateAgentgateway(t, o)
			if pol := agentgateway.Model(o.Object).(*agentgateway.Policy); pol.Spec.Traffic != nil {
				p = pol
			}
		}
	}
	if p == nil {
		t.Fatal("no AgentgatewayPolicy rendered")
	}
	var paths [][]string
	for _, d := range p.Spec.Traffic.RateLimit.Global.Descriptors {
		var names []string
		for _, e := range d.Entries {
			names = append(names, e.Name+"="+e.Expression)
		}
		paths = append(paths, names)
	}
	want := [][]string{
		{`budget="per-run"`, `principal=coalesce(string(jwt["run_id"]), "budgetgen/no-claim")`},
		{`budget="per-run-daily"`, `window="day"`, `principal=coalesce(string(jwt["run_id"]), "budgetgen/no-claim")`},
		{`budget="per-run-daily"`, `window="week"`, `principal=coalesce(string(jwt["run_id"]), "budgetgen/no-claim")`},
		{`budget="per-run-daily"`, `window="month"`, `principal=coalesce(string(jwt["run_id"]), "budgetgen/no-claim")`},
		{`budget="agent-fleet"`, `window="day"`, `group=coalesce(string(jwt["kind"]), "budgetgen/no-claim")`},
		{`budget="agent-fleet"`, `window="month"`, `group=coalesce(string(jwt["kind"]), "budgetgen/no-claim")`},
	}
	if !slices.EqualFunc(paths, want, slices.Equal[[]string]) {
		t.Errorf("descriptors:\n%q\nwant\n%q", paths, want)
	}

	files, err := rlsconfig.Files(res.AgentgatewayConfigs)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 {
		t.Fatalf("%d config files, want 1", len(files))
	}
	var cfgFiles []config.File
	for name, data := range files {
		golden(t, "testdata/agentgateway_windows.ratelimit.golden.yaml", data)
		cfgFiles = append(cfgFiles, config.File{Name: name, Data: data})
	}
	cfg, err := config.Load(cfgFiles)
	if err != nil {
		t.Fatalf("our service refuses the config: %v", err)
	}
	if na := cfg.NotApplied(); len(na) > 0 {
		t.Errorf("our service ignores parts of the config: %v", na)
	}
	m, err := budgetmap.Encode(BudgetMap(bs))
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "testdata/agentgateway_windows.budgetmap.golden.yaml", m)
}

// golden compares got with the file at path (rewritten with -update).
func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		t.Fatalf("%v (run go test ./pkg/render -update)", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s differs (run go test ./pkg/render -update and review the diff):\n%s", path, got)
	}
}
