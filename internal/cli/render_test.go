package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// runStdin executes budgetgen in-process with stdin.
func runStdin(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Run(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

const examplePath = "../../examples/budgets.yaml"

func TestRenderOptionsFromArgs(t *testing.T) {
	tests := []struct {
		args    []string
		out     string
		want    renderOptions
		wantErr bool
	}{
		{nil, "", renderOptions{specPath: "budgets.yaml"}, false},
		{[]string{"-"}, "", renderOptions{specPath: "-"}, false},
		{[]string{"x.yaml"}, "dir", renderOptions{specPath: "x.yaml", outDir: "dir"}, false},
		{[]string{""}, "", renderOptions{}, true},
		{[]string{"x.yaml"}, "-", renderOptions{}, true},
	}
	for _, tc := range tests {
		got, err := renderOptionsFromArgs(tc.args, tc.out)
		if (err != nil) != tc.wantErr {
			t.Errorf("%v -o %q: err = %v", tc.args, tc.out, err)
			continue
		}
		if err == nil && got != tc.want {
			t.Errorf("%v -o %q = %+v, want %+v", tc.args, tc.out, got, tc.want)
		}
		if err != nil && exitCode(err) != ExitUsage {
			t.Errorf("%v -o %q: exit %d, want 2", tc.args, tc.out, exitCode(err))
		}
	}
}

func TestRenderCommand(t *testing.T) {
	exampleData, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	bs, err := spec.Load(exampleData, "budgets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := render.Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	want := string(res.YAML())

	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	badSpec := strings.Replace(string(exampleData), "tokensPerDay: 2000000,", "tokensPerDay: 0,", 1)
	if err := os.WriteFile(bad, []byte(badSpec), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name       string
		stdin      string
		args       []string
		code       int
		stdout     string
		stderrHas  string
		noStdout   bool
		outDir     string // must not exist afterwards
		stdoutHas  string
		stdoutSkip bool
	}{
		{name: "file to stdout", args: []string{"render", examplePath}, code: 0, stdout: want},
		{name: "stdin", stdin: string(exampleData), args: []string{"render", "-"}, code: 0, stdout: want},
		{name: "bad spec", args: []string{"render", bad}, code: 1, noStdout: true,
			stderrHas: "bad.yaml:46: spec.budgets[2].tokensPerDay: must be > 0"},
		{name: "bad spec stdin", stdin: badSpec, args: []string{"render", "-"}, code: 1, noStdout: true,
			stderrHas: "budgetgen: <stdin>:46: spec.budgets[2].tokensPerDay: must be > 0"},
		{name: "bad spec -o", args: []string{"render", bad, "-o", filepath.Join(dir, "out-bad")}, code: 1, noStdout: true,
			outDir: filepath.Join(dir, "out-bad"), stderrHas: "spec.budgets[2].tokensPerDay"},
		{name: "missing file", args: []string{"render", filepath.Join(dir, "nope.yaml")}, code: 2, noStdout: true, stderrHas: "nope.yaml"},
		{name: "too many args", args: []string{"render", "a", "b"}, code: 2, noStdout: true, stderrHas: "accepts at most 1 arg"},
		{name: "unknown flag", args: []string{"render", "--bogus"}, code: 2, noStdout: true, stderrHas: "unknown flag"},
		{name: "-o file", args: []string{"render", examplePath, "-o", bad}, code: 2, noStdout: true, stderrHas: "not a directory"},
		{name: "help", args: []string{"render", "--help"}, code: 0, stdoutHas: "budgetgen render examples/budgets.yaml -o examples/rendered", stdoutSkip: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runStdin(t, tc.stdin, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if tc.noStdout && stdout != "" {
				t.Errorf("stdout on error: %q", stdout)
			}
			if tc.stdout != "" && stdout != tc.stdout {
				t.Errorf("stdout differs from render.Render:\n%s", stdout)
			}
			if tc.stdoutHas != "" && !strings.Contains(stdout, tc.stdoutHas) {
				t.Errorf("stdout lacks %q:\n%s", tc.stdoutHas, stdout)
			}
			if tc.stderrHas != "" && !strings.Contains(stderr, tc.stderrHas) {
				t.Errorf("stderr %q lacks %q", stderr, tc.stderrHas)
			}
			if tc.outDir != "" {
				if _, err := os.Stat(tc.outDir); err == nil {
					t.Errorf("%s was created on error", tc.outDir)
				}
			}
		})
	}
}

func TestRenderOutputDir(t *testing.T) {
	out := filepath.Join(t.TempDir(), "rendered")
	if code, _, stderr := runStdin(t, "", "render", examplePath, "-o", out); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	// Same content as the committed examples/rendered.
	entries, err := os.ReadDir("../../examples/rendered")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(entries) {
		t.Fatalf("wrote %d files, examples/rendered has %d", len(got), len(entries))
	}
	for _, e := range entries {
		a, _ := os.ReadFile(filepath.Join("../../examples/rendered", e.Name()))
		b, err := os.ReadFile(filepath.Join(out, e.Name()))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs from examples/rendered (%v)", e.Name(), err)
		}
	}
	// A user's file survives a re-render; a stale generated file does not.
	os.WriteFile(filepath.Join(out, "notes.md"), []byte("mine"), 0o644)
	os.WriteFile(filepath.Join(out, "old.yaml"), []byte("# Code generated by budgetgen render. DO NOT EDIT.\nkind: X\n"), 0o644)
	if code, _, stderr := runStdin(t, "", "render", examplePath, "-o", out); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(out, "notes.md")); err != nil {
		t.Error("user file removed")
	}
	if _, err := os.Stat(filepath.Join(out, "old.yaml")); err == nil {
		t.Error("stale generated file kept")
	}
	// A failed render leaves the previous output untouched.
	before, _ := os.ReadFile(filepath.Join(out, "kustomization.yaml"))
	if code, _, _ := runStdin(t, "kind: nope\n", "render", "-", "-o", out); code != 1 {
		t.Errorf("bad stdin spec: exit %d", code)
	}
	after, _ := os.ReadFile(filepath.Join(out, "kustomization.yaml"))
	if !bytes.Equal(before, after) {
		t.Error("failed render changed the output directory")
	}
}

func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		code, stdout, stderr := runStdin(t, "", "completion", shell)
		if code != 0 || !strings.Contains(stdout, "budgetgen") {
			t.Errorf("completion %s: exit %d, stderr %q, %d bytes", shell, code, stderr, len(stdout))
		}
	}
	code, stdout, _ := runStdin(t, "", "__complete", "init", "--template", "")
	if code != 0 || !strings.Contains(stdout, "ai-gateway") || !strings.Contains(stdout, "minimal") {
		t.Errorf("template completion: exit %d: %q", code, stdout)
	}
	code, stdout, _ = runStdin(t, "", "__complete", "")
	if code != 0 || !strings.Contains(stdout, "render") || !strings.Contains(stdout, "init") {
		t.Errorf("subcommand completion: exit %d: %q", code, stdout)
	}
}

func TestRenderNotesCostEntries(t *testing.T) {
	var out, errOut bytes.Buffer
	code := Run(context.Background(), []string{"render", "../../pkg/render/testdata/large_cap.yaml"}, strings.NewReader(""), &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(errOut.String(), "rules charge budgetgen_total_ktokens") || !strings.Contains(out.String(), "budgetgen_total_ktokens") {
		t.Fatalf("stderr %q", errOut.String())
	}
	errOut.Reset()
	if code := Run(context.Background(), []string{"render", "../../pkg/render/testdata/group_enforce.yaml"}, strings.NewReader(""), &out, &errOut); code != 0 || errOut.Len() != 0 {
		t.Fatalf("plain token caps: exit %d, stderr %q", code, errOut.String())
	}
}
