package cli

import (
	"bytes"
	"context"
	"os"
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
	if !ids["budgetgen-render"] || !ids["budgetgen-assert"] {
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
