package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/templates"
)

// TestReadmeLifecycle runs the README's budget lifecycle as written, for every
// starter template, in a fresh directory: init writes the spec and the
// platform objects (gateway/), render writes manifests/, render --check finds
// no drift, and assert over manifests/ and gateway/ with the spec passes with
// no finding at all (schema included).
func TestReadmeLifecycle(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var steps [][]string
	for _, line := range strings.Split(string(readme), "\n") {
		for _, sub := range []string{"init", "render", "assert"} {
			if m := regexp.MustCompile(`^budgetgen ` + sub + ` ([^#]*?)\s*(#|$)`).FindStringSubmatch(line); m != nil {
				steps = append(steps, append([]string{sub}, strings.Fields(m[1])...))
			}
		}
	}
	if len(steps) != 4 || steps[0][0] != "init" || steps[3][0] != "assert" {
		t.Fatalf("README lifecycle steps: %q", steps)
	}
	for _, name := range templates.Names() {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			t.Chdir(dir)
			for _, step := range steps {
				args := step
				if step[0] == "init" {
					args = append(append([]string{}, step...), "--template", name)
				}
				code, stdout, stderr := runStdin(t, "", args...)
				if code != ExitOK {
					t.Fatalf("budgetgen %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
				}
				if step[0] == "assert" && !strings.Contains(stdout, "ok: 0 errors, 0 warnings") {
					t.Errorf("assert:\n%s", stdout)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "gateway", "gateway.yaml")); err != nil {
				t.Errorf("init wrote no gateway manifests: %v", err)
			}
		})
	}
}

// TestInitWritesBothOrNeither: an existing gateway file stops init before it
// writes the spec; --no-gateway writes the spec alone.
func TestInitWritesBothOrNeither(t *testing.T) {
	dir := t.TempDir()
	gw := filepath.Join(dir, "gateway", "gateway.yaml")
	if err := os.MkdirAll(filepath.Dir(gw), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gw, []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(dir, "budgets.yaml")
	code, _, stderr := runStdin(t, "", "init", "-o", spec)
	if code != ExitFailure || !strings.Contains(stderr, "gateway.yaml already exists") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if _, err := os.Stat(spec); err == nil {
		t.Error("init wrote the spec although the gateway file was refused")
	}
	if b, _ := os.ReadFile(gw); string(b) != "mine\n" {
		t.Error("init overwrote the gateway file")
	}
	if code, _, stderr := runStdin(t, "", "init", "-o", spec, "--no-gateway"); code != ExitOK {
		t.Fatalf("--no-gateway: exit %d: %s", code, stderr)
	}
	if b, _ := os.ReadFile(gw); string(b) != "mine\n" {
		t.Error("--no-gateway touched the gateway file")
	}
	// --force over an existing spec whose gateway file cannot be written
	// (its directory is a file): the spec is put back.
	dir2 := t.TempDir()
	spec2 := filepath.Join(dir2, "budgets.yaml")
	if err := os.WriteFile(spec2, []byte("my spec\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir2, "gateway"), []byte("not a directory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runStdin(t, "", "init", "-o", spec2, "--force"); code != ExitFailure {
		t.Fatalf("--force with an unwritable gateway file: exit %d: %s", code, stderr)
	}
	if b, _ := os.ReadFile(spec2); string(b) != "my spec\n" {
		t.Errorf("--force left %q in the spec after the gateway file failed, want the previous spec", b)
	}
}
