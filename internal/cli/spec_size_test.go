package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/spec"
)

// TestHugeSpecIsRefused: a spec file above spec.MaxFileBytes (a log or an
// image given by mistake) is refused with exit 2 and the reason, naming the
// file, by every command that reads a spec, instead of being read whole
// into memory and failing on its first odd byte.
func TestHugeSpecIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.yaml")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("apiVersion: budgetgen.dev/v1alpha1\n#"); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(spec.MaxFileBytes + 1); err != nil { // sparse: cheap
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"render", path},
		{"promote", "per-run", "--spec", path, "--force", "--reason", "r"},
		{"demote", "per-run", "--spec", path},
		{"assert", "../../examples/rendered", "--spec", path},
	} {
		code, _, stderr := runCLI(t, args...)
		if code != ExitUsage || !strings.Contains(stderr, path) || !strings.Contains(stderr, "file too large") {
			t.Errorf("budgetgen %s: exit %d, stderr %q; want exit %d naming the file and \"file too large\"", strings.Join(args, " "), code, stderr, ExitUsage)
		}
	}
}

// TestMissingSpecSaysWhatToDo: render without a spec where it looks (the
// default budgets.yaml, or a mistyped path) exits 2 and points at init.
func TestMissingSpecSaysWhatToDo(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "budgets.yaml")
	for _, args := range [][]string{{"render", missing}, {"assert", "../../examples/rendered", "--spec", missing}} {
		code, _, stderr := runCLI(t, args...)
		if code != ExitUsage || !strings.Contains(stderr, missing) || !strings.Contains(stderr, "budgetgen init") {
			t.Errorf("budgetgen %s: exit %d, stderr %q; want exit %d naming the file and budgetgen init", strings.Join(args, " "), code, stderr, ExitUsage)
		}
	}
}
