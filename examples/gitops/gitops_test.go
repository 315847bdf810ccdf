// Package gitops holds the example GitOps repository layout and the test that
// runs its CI pipeline the way .github/workflows/budgets.yaml and
// .pre-commit-config.yaml do.
package gitops

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/budgetgen/budgetgen/internal/cli"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

var update = flag.Bool("update", false, "re-render deploy/budgets from budgets/budgets.yaml")

const (
	specPath   = "budgets/budgets.yaml"
	renderDir  = "deploy/budgets"
	workflow   = ".github/workflows/budgets.yaml"
	preCommit  = ".pre-commit-config.yaml"
	budgetgenC = "budgetgen "
)

// renderDrift compares render's manifests with the committed directory byte
// for byte through the Go API, independently of render --check (which
// runRenderCheck runs), including files render would delete.
func renderDrift(t *testing.T) {
	t.Helper()
	bs, err := spec.LoadFile(specPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := render.Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	files := res.Files()
	if *update {
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(renderDir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(renderDir, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s/%s is not what render produces (run go test ./examples/gitops -update): %v", renderDir, name, err)
		}
	}
	entries, err := os.ReadDir(renderDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if _, ok := files[e.Name()]; !ok {
			t.Errorf("%s/%s is committed but render does not produce it", renderDir, e.Name())
		}
	}
}

// gateCommand is one budgetgen assert command line of the CI workflow or
// of the pre-commit hooks, and the directory whose `kustomize build` it
// reads on stdin ("" when it reads none).
type gateCommand struct {
	args      []string
	kustomize string
}

// gateCommands returns the gate commands of the CI workflow and of the
// pre-commit hooks, so the test runs exactly what they run.
func gateCommands(t *testing.T) []gateCommand {
	t.Helper()
	var cmds []gateCommand
	add := func(line string) {
		build := ""
		if first, rest, ok := strings.Cut(line, " | "); ok && strings.HasPrefix(first, "kustomize build ") {
			build, line = strings.TrimPrefix(first, "kustomize build "), rest
		}
		if strings.HasPrefix(line, budgetgenC+"assert ") {
			cmds = append(cmds, gateCommand{strings.Fields(line)[1:], build})
		}
	}
	var wf struct {
		Jobs map[string]struct {
			Steps []struct{ Name, Run string }
		}
	}
	readYAML(t, workflow, &wf)
	for _, job := range wf.Jobs {
		for _, s := range job.Steps {
			add(s.Run)
		}
	}
	var pc struct {
		Repos []struct {
			Hooks []struct{ ID, Entry string }
		}
	}
	readYAML(t, preCommit, &pc)
	for _, r := range pc.Repos {
		for _, h := range r.Hooks {
			add(h.Entry)
		}
	}
	if len(cmds) < 3 || !slices.ContainsFunc(cmds, func(c gateCommand) bool { return c.kustomize != "" }) {
		t.Fatalf("found %d assert commands in %s and %s, want the CI steps (one over kustomize build) and the hook", len(cmds), workflow, preCommit)
	}
	return cmds
}

// run runs the gate command on the repository copy in dir (paths under
// dir), piping `kustomize build` (krusty, in-process) to it when it reads
// one, and returns its exit code and output.
func (g gateCommand) run(t *testing.T, dir string) (int, string) {
	t.Helper()
	args := slices.Clone(g.args)
	for i, a := range args {
		if a == specPath || strings.HasPrefix(a, "deploy/") {
			args[i] = filepath.Join(dir, a)
		}
	}
	stdin := ""
	if g.kustomize != "" {
		m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(dir, g.kustomize))
		if err != nil {
			t.Fatalf("kustomize build %s: %v", g.kustomize, err)
		}
		y, err := m.AsYaml()
		if err != nil {
			t.Fatal(err)
		}
		stdin = string(y)
	}
	var out bytes.Buffer
	code := cli.Run(context.Background(), args, strings.NewReader(stdin), &out, &out)
	return code, out.String()
}

func (g gateCommand) String() string {
	if g.kustomize != "" {
		return "kustomize build " + g.kustomize + " | budgetgen " + strings.Join(g.args, " ")
	}
	return "budgetgen " + strings.Join(g.args, " ")
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// renderCommands returns the render drift check command line ("budgetgen
// render SPEC -o DIR ... --check") of every workflow step and pre-commit
// hook, so the test runs exactly what they run.
func renderCommands(t *testing.T) [][]string {
	t.Helper()
	var lines []string
	var wf struct {
		Jobs map[string]struct {
			Steps []struct{ Name, Run string }
		}
	}
	readYAML(t, workflow, &wf)
	for _, job := range wf.Jobs {
		for _, s := range job.Steps {
			lines = append(lines, s.Run)
		}
	}
	var pc struct {
		Repos []struct {
			Hooks []struct{ ID, Entry string }
		}
	}
	readYAML(t, preCommit, &pc)
	for _, r := range pc.Repos {
		for _, h := range r.Hooks {
			lines = append(lines, h.Entry)
		}
	}
	var cmds [][]string
	for _, l := range lines {
		if args := strings.Fields(l); strings.HasPrefix(l, budgetgenC+"render ") && slices.Contains(args, "--check") {
			cmds = append(cmds, args[1:])
		}
	}
	if len(cmds) < 2 {
		t.Fatalf("found %d render drift checks in %s and %s, want the CI step and the hook", len(cmds), workflow, preCommit)
	}
	return cmds
}

// runRender runs a budgetgen command line with every path argument under
// dir and returns its exit code and output.
func runRender(t *testing.T, dir string, args []string) (int, string) {
	t.Helper()
	args = slices.Clone(args)
	for i, a := range args {
		if i > 0 && !strings.HasPrefix(a, "-") {
			args[i] = filepath.Join(dir, a) // the spec and every output path
		}
	}
	var out bytes.Buffer
	code := cli.Run(context.Background(), args, strings.NewReader(""), &out, &out)
	return code, out.String()
}

// runRenderCheck runs a drift check command line on the repository: it
// passes when every file render writes is committed as render writes it.
// With -update it renders into the repository instead.
func runRenderCheck(t *testing.T, args []string) {
	t.Helper()
	if *update {
		args = slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "--check" })
	}
	if code, out := runRender(t, ".", args); code != 0 {
		t.Fatalf("budgetgen %s: exit %d (run go test ./examples/gitops -update and commit the result)\n%s", strings.Join(args, " "), code, out)
	}
}

// TestPipeline runs the repository's pipeline as CI would: render's drift
// check (the workflow's and the hook's own command lines), then every
// budgetgen assert command of the workflow and the pre-commit config,
// in-process through cli.Run.
func TestPipeline(t *testing.T) {
	renderDrift(t)
	for _, args := range renderCommands(t) {
		runRenderCheck(t, args)
	}
	for _, g := range gateCommands(t) {
		if code, out := g.run(t, "."); code != 0 {
			t.Errorf("%s: exit %d\n%s", g, code, out)
		}
	}
}

// TestDriftCheckCatchesMissingFile: in a copy of the repository with one
// rate limit config file not committed (an untracked file is no git diff),
// every drift check command fails and names it.
func TestDriftCheckCatchesMissingFile(t *testing.T) {
	dir := copyExample(t)
	missing := "deploy/ratelimit/config/agents_ai-budgets-agent-gateway.yaml"
	if err := os.Remove(filepath.Join(dir, missing)); err != nil {
		t.Fatal(err)
	}
	for _, args := range renderCommands(t) {
		code, out := runRender(t, dir, args)
		if code != 1 || !strings.Contains(out, missing+": would create") {
			t.Errorf("budgetgen %s without %s: exit %d, want 1 naming it\n%s", strings.Join(args, " "), missing, code, out)
		}
		if _, err := os.Stat(filepath.Join(dir, missing)); err == nil {
			t.Fatalf("the drift check wrote %s", missing)
		}
	}
}

// TestPipelineCatchesHandEdit shows the gate failing the build: a copy of the
// repository with one rendered budget edited by hand (shadow mode removed)
// fails with BG002 (enforcing without promotion) and BG008 (drift).
func TestPipelineCatchesHandEdit(t *testing.T) {
	dir := copyExample(t)
	entries, err := filepath.Glob(filepath.Join(dir, renderDir, "backendtrafficpolicy_*.yaml"))
	if err != nil || len(entries) != 1 {
		t.Fatalf("rendered policy: %v %v", entries, err)
	}
	data, err := os.ReadFile(entries[0])
	if err != nil {
		t.Fatal(err)
	}
	// The first rule (per-human, shadow in the spec) now enforces.
	edited := strings.Replace(string(data), "shadowMode: true", "shadowMode: false", 1)
	if err := os.WriteFile(entries[0], []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, g := range gateCommands(t) {
		code, out := g.run(t, dir)
		// The gate over kustomize build skips drift (BG008): it reads what
		// is applied, not what render writes.
		drift := !slices.Contains(g.args, "BG008")
		if code != 1 || !strings.Contains(out, "BG002") || drift != (strings.Contains(out, "BG008 error") || strings.Contains(out, "title=BG008")) {
			t.Errorf("%s: exit %d, want 1 with BG002 (and BG008: %v)\n%s", g, code, drift, out)
		}
	}
}

// TestPipelineCatchesAgentgatewayModeEdit: agentgateway's shadow mode lives
// in the rate limit config, not in a policy. Removing per-run's shadow_mode
// there by hand (per-run is in shadow in the spec) fails every gate command
// with BG020 on that file.
func TestPipelineCatchesAgentgatewayModeEdit(t *testing.T) {
	dir := copyExample(t)
	cfg := filepath.Join(dir, "deploy/ratelimit/config/agents_ai-budgets-agent-gateway.yaml")
	data, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(data), "        shadow_mode: true\n", "", 1) // per-run's limit comes first
	if edited == string(data) {
		t.Fatal("fixture edit did not apply")
	}
	if err := os.WriteFile(cfg, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, g := range gateCommands(t) {
		code, out := g.run(t, dir)
		// Text or GitHub annotations: the file (or the ConfigMap kustomize
		// made of it), the rule and the field either way.
		where := cfg
		if g.kustomize != "" {
			where = "data[agents_ai-budgets-agent-gateway.yaml]"
		}
		if code != 1 || !strings.Contains(out, where) || !strings.Contains(out, "BG020") ||
			!strings.Contains(out, `descriptors[0].descriptors[0]: budget "per-run" is in shadow mode in the spec`) {
			t.Errorf("%s: exit %d, want 1 with BG020 on %s\n%s", g, code, where, out)
		}
	}
}

// copyExample copies this example into a temporary directory, at the same
// place relative to the kustomize base it uses (deploy/budgetgen-ratelimit
// of the repository), and returns the copy's directory.
func copyExample(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "examples", "gitops")
	if err := os.CopyFS(dir, os.DirFS(".")); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join("..", "..", "deploy", "budgetgen-ratelimit")
	if err := os.CopyFS(filepath.Join(root, "deploy", "budgetgen-ratelimit"), os.DirFS(base)); err != nil {
		t.Fatal(err)
	}
	return dir
}
