package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/spec"
	"github.com/budgetgen/budgetgen/templates"
)

func TestInitOptionsValidate(t *testing.T) {
	tests := []struct {
		o    initOptions
		code int
	}{
		{initOptions{template: "minimal", output: "budgets.yaml"}, ExitOK},
		{initOptions{template: "ai-gateway", output: "-"}, ExitOK},
		{initOptions{template: "nope", output: "budgets.yaml"}, ExitUsage},
		{initOptions{template: "minimal", output: ""}, ExitUsage},
	}
	for _, tc := range tests {
		if got := exitCode(tc.o.validate()); got != tc.code {
			t.Errorf("%+v: exit %d, want %d", tc.o, got, tc.code)
		}
	}
}

func TestInitCommand(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "budgets.yaml")

	// Just before midnight UTC in UTC+2: the UTC day is the 16th.
	code, _, stderr := runStdin(t, "", "init", "-o", path, "--now", "2026-10-17T01:30:00+02:00")
	if code != 0 {
		t.Fatalf("init: exit %d: %s", code, stderr)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, _ := templates.Get(templates.Default)
	want, _ := templates.WithShadowSince(tmpl, "2026-10-16")
	if string(data) != string(want) || string(data) == string(tmpl) {
		t.Error("init did not write the default template with shadowSince")
	}
	bs, err := spec.Load(data, "budgets.yaml")
	if err != nil {
		t.Fatalf("written spec does not load: %v", err)
	}
	for _, ref := range bs.Refs() {
		if ref.Rollout.ShadowSince != "2026-10-16" {
			t.Errorf("budget %s: shadowSince %q", ref.Name, ref.Rollout.ShadowSince)
		}
	}
	// The written spec renders through the CLI, without the missing-shadowSince warning.
	if code, stdout, stderr := runStdin(t, "", "render", path); code != 0 || !strings.Contains(stdout, "BackendTrafficPolicy") || strings.Contains(stderr, "warning") {
		t.Errorf("render of init output: exit %d: %s", code, stderr)
	}
	// Without shadowSince, render warns with the file, line and budget, and still renders.
	os.WriteFile(path, tmpl, 0o644)
	code, stdout, stderr := runStdin(t, "", "render", path)
	if code != 0 || !strings.Contains(stdout, "BackendTrafficPolicy") ||
		!strings.Contains(stderr, path+":21: spec.budgets[0]: budget per-api-key is in shadow mode without shadowSince; budgetgen promote will refuse it") {
		t.Errorf("render without shadowSince: exit %d: %s", code, stderr)
	}

	// Refuses to overwrite, leaving the file alone.
	os.WriteFile(path, []byte("mine"), 0o644)
	code, _, stderr = runStdin(t, "", "init", "--template", "ai-gateway", "-o", path)
	if code != 1 || !strings.Contains(stderr, "already exists (use --force to overwrite)") {
		t.Errorf("overwrite: exit %d: %s", code, stderr)
	}
	if b, _ := os.ReadFile(path); string(b) != "mine" {
		t.Error("init overwrote an existing file without --force")
	}
	code, _, stderr = runStdin(t, "", "init", "--template", "ai-gateway", "-o", path, "--force")
	if code != 0 {
		t.Fatalf("--force: exit %d: %s", code, stderr)
	}
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), "agent-fleet") {
		t.Error("--force did not write the ai-gateway template")
	}

	code, stdout, _ = runStdin(t, "", "init", "-t", "ai-gateway", "-o", "-", "--now", "2026-11-02T10:00:00Z")
	if code != 0 || !strings.Contains(stdout, "kind: BudgetSet") || strings.Count(stdout, "shadowSince: 2026-11-02") != 5 {
		t.Errorf("init -o -: exit %d", code)
	}

	for _, args := range [][]string{
		{"init", "--template", "nope", "-o", filepath.Join(dir, "x.yaml")},
		{"init", "extra-arg"},
		{"init", "--bogus"},
		{"init", "--now", "yesterday", "-o", filepath.Join(dir, "y.yaml")},
	} {
		code, stdout, stderr := runStdin(t, "", args...)
		if code != 2 || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x.yaml")); err == nil {
		t.Error("init with unknown template wrote a file")
	}
	// A directory that cannot be created (a file is in the way): exit 1.
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runStdin(t, "", "init", "-o", filepath.Join(dir, "file", "b.yaml"))
	if code != 1 {
		t.Errorf("init under a file: exit %d: %s", code, stderr)
	}
}

// TestInitIntoNewDirectory: the example of init --help, -o
// platform/budgets.yaml in a repository without platform/, writes the spec
// and its gateway/ there, and the hint it prints works as given.
func TestInitIntoNewDirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "platform", "budgets.yaml")
	code, _, stderr := runStdin(t, "", "init", "--template", "ai-gateway", "-o", path)
	if code != ExitOK {
		t.Fatalf("init -o %s: exit %d: %s", path, code, stderr)
	}
	for _, f := range []string{path, filepath.Join(dir, "platform", "gateway", "gateway.yaml")} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("not written: %v", err)
		}
	}
	if code, _, stderr := runStdin(t, "", "render", path); code != ExitOK {
		t.Errorf("render %s: exit %d: %s", path, code, stderr)
	}
}
