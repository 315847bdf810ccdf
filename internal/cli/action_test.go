package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// budgetgenCalls finds the budgetgen invocations in a shell script: each
// segment between &&, ||, |, ; and newlines that starts with budgetgen,
// split into words with quotes removed.
func budgetgenCalls(script string) [][]string {
	var out [][]string
	for _, seg := range regexp.MustCompile(`&&|\|\||\||;|\n`).Split(script, -1) {
		seg = strings.TrimSpace(seg)
		if i := strings.Index(seg, ">"); i >= 0 {
			seg = seg[:i] // redirection
		}
		words := strings.Fields(strings.NewReplacer(`"`, "", `'`, "").Replace(seg))
		if len(words) > 0 && words[0] == "budgetgen" {
			out = append(out, words[1:])
		}
	}
	return out
}

// checkCall runs `budgetgen SUB --help` and checks every flag the call uses
// is in it.
func checkCall(t *testing.T, where string, args []string) {
	t.Helper()
	if len(args) == 0 {
		t.Fatalf("%s: bare budgetgen", where)
	}
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{args[0], "--help"}, strings.NewReader(""), &out, &errb); code != ExitOK {
		t.Fatalf("%s: budgetgen %s is not a subcommand (exit %d): %s", where, args[0], code, errb.String())
	}
	help := out.String()
	if !strings.Contains(help, "Usage:") {
		t.Fatalf("%s: no usage for %s", where, args[0])
	}
	for _, a := range args[1:] {
		if !strings.HasPrefix(a, "-") || a == "-" {
			continue
		}
		name, _, _ := strings.Cut(a, "=")
		var ok bool
		if strings.HasPrefix(name, "--") {
			ok = strings.Contains(help, name+" ") || strings.Contains(help, name+"\n")
		} else {
			ok = strings.Contains(help, name+", ")
		}
		if !ok {
			t.Errorf("%s: budgetgen %s has no flag %s", where, args[0], name)
		}
	}
}

// TestActionAndPreCommitHooks: the composite action and the pre-commit hooks
// only run budgetgen subcommands and flags that exist.
func TestActionAndPreCommitHooks(t *testing.T) {
	var action struct {
		Name string
		Runs struct {
			Using string
			Steps []struct {
				ID   string
				Name string
				Uses string
				Run  string
				With map[string]string
			}
		}
	}
	b, err := os.ReadFile("../../action.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &action); err != nil {
		t.Fatal(err)
	}
	if action.Runs.Using != "composite" {
		t.Fatalf("action runs %q", action.Runs.Using)
	}
	var calls [][]string
	uses := map[string]bool{}
	for _, st := range action.Runs.Steps {
		if st.Uses != "" {
			uses[strings.Split(st.Uses, "@")[0]] = true
		}
		for _, c := range budgetgenCalls(st.Run) {
			checkCall(t, "action.yml step "+st.Name, c)
			calls = append(calls, c)
		}
	}
	// install, render drift, assert as SARIF (uploaded) and as annotations.
	joined := []string{}
	for _, c := range calls {
		joined = append(joined, strings.Join(c, " "))
	}
	all := strings.Join(joined, "\n")
	for _, want := range []string{"version", "render $SPEC -o $MANIFESTS", "assert --spec $SPEC -o sarif", "assert --spec $SPEC -o github"} {
		if !strings.Contains(all, want) {
			t.Errorf("action.yml does not run budgetgen %s:\n%s", want, all)
		}
	}
	if !uses["actions/setup-go"] || !uses["github/codeql-action/upload-sarif"] {
		t.Errorf("action uses %v", uses)
	}

	var hooks []struct {
		ID            string   `json:"id"`
		Entry         string   `json:"entry"`
		Args          []string `json:"args"`
		Language      string   `json:"language"`
		PassFilenames *bool    `json:"pass_filenames"`
	}
	b, err = os.ReadFile("../../.pre-commit-hooks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &hooks); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, h := range hooks {
		ids[h.ID] = true
		cs := budgetgenCalls(h.Entry + " " + strings.Join(h.Args, " "))
		if len(cs) != 1 || h.Language != "golang" {
			t.Fatalf("hook %s: entry %q language %s", h.ID, h.Entry, h.Language)
		}
		checkCall(t, "hook "+h.ID, cs[0])
	}
	if !ids["budgetgen-render"] || !ids["budgetgen-render-check"] || !ids["budgetgen-assert"] {
		t.Fatalf("hooks %v", ids)
	}
	// The hooks' default arguments work on the example GitOps layout.
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("../../examples/gitops")); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	for _, h := range hooks {
		var out, errb bytes.Buffer
		args := append(strings.Fields(h.Entry)[1:], h.Args...)
		if code := Run(context.Background(), args, strings.NewReader(""), &out, &errb); code != ExitOK {
			t.Errorf("hook %s on examples/gitops: exit %d\n%s%s", h.ID, code, out.String(), errb.String())
		}
	}
}

func TestBudgetgenCalls(t *testing.T) {
	got := budgetgenCalls(`go install ./cmd/budgetgen && budgetgen version
budgetgen assert --spec "$SPEC" -o sarif x > "$f" || true`)
	if len(got) != 2 || strings.Join(got[0], " ") != "version" || strings.Join(got[1], " ") != "assert --spec $SPEC -o sarif x" {
		t.Fatalf("%q", got)
	}
}

// TestActionDriftStepRuns runs action.yml's render drift step as the runner
// would (bash, budgetgen on PATH) in a throwaway checkout: it fails before
// anything is rendered, passes on a committed render, and fails on a
// changed spec and on a file render writes that is missing (which a plain
// git diff would not see: an untracked file is no diff).
func TestActionDriftStepRuns(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("bash is required: %v", err)
	}
	var action struct {
		Runs struct{ Steps []struct{ Name, Run string } }
	}
	b, err := os.ReadFile("../../action.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &action); err != nil {
		t.Fatal(err)
	}
	var script string
	for _, st := range action.Runs.Steps {
		if st.Name == "Render drift check" {
			script = st.Run
		}
	}
	if script == "" {
		t.Fatal("no 'Render drift check' step in action.yml")
	}
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "budgetgen"), "../../cmd/budgetgen").CombinedOutput(); err != nil {
		t.Fatalf("build budgetgen: %v\n%s", err, out)
	}
	repo := t.TempDir()
	spec, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(repo, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(repo, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"SPEC=budgets/budgets.yaml", "MANIFESTS=deploy/budgets", "RLS=deploy/ratelimit", "MAP=deploy/budget-map.yaml")
	step := func() (bool, string) {
		cmd := exec.Command("bash", "-c", script)
		cmd.Dir, cmd.Env = repo, env
		out, err := cmd.CombinedOutput()
		return err == nil, string(out)
	}
	write("budgets/budgets.yaml", spec)
	if ok, out := step(); ok || !strings.Contains(out, "deploy/budgets/kustomization.yaml: would create") {
		t.Fatalf("drift step passed with nothing rendered:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(repo, "deploy")); err == nil {
		t.Fatal("the drift step wrote files")
	}
	render := exec.Command(filepath.Join(bin, "budgetgen"), "render", "budgets/budgets.yaml", "-o", "deploy/budgets", "--ratelimit-config", "deploy/ratelimit", "--budget-map", "deploy/budget-map.yaml")
	render.Dir, render.Env = repo, env
	if out, err := render.CombinedOutput(); err != nil {
		t.Fatalf("render: %v\n%s", err, out)
	}
	if ok, out := step(); !ok {
		t.Fatalf("drift step failed on a committed render:\n%s", out)
	}
	// A changed cap changes committed files.
	write("budgets/budgets.yaml", []byte(strings.Replace(string(spec), "tokensPerDay: 2000000,", "tokensPerDay: 3000000,", 1)))
	if ok, out := step(); ok || !strings.Contains(out, "would update") || !strings.Contains(out, "+") {
		t.Fatalf("drift step passed on a changed spec:\n%s", out)
	}
	write("budgets/budgets.yaml", spec)
	// A file render writes that nobody committed.
	if err := os.Remove(filepath.Join(repo, "deploy/budgets/kustomization.yaml")); err != nil {
		t.Fatal(err)
	}
	if ok, out := step(); ok || !strings.Contains(out, "deploy/budgets/kustomization.yaml: would create") {
		t.Fatalf("drift step passed with a rendered file not committed:\n%s", out)
	}
}
