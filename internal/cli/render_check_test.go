package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// render --check passes on what render wrote, fails with a diff naming
// each file render would create, update or remove (of every output), and
// never writes.
func TestRenderCheck(t *testing.T) {
	dir := t.TempDir()
	out, rls, bm := filepath.Join(dir, "out"), filepath.Join(dir, "rls"), filepath.Join(dir, "map", "budget-map.yaml")
	args := []string{"render", examplePath, "-o", out, "--ratelimit-config", rls, "--budget-map", bm}
	check := append(append([]string{}, args...), "--check")

	code, stdout, stderr := runStdin(t, "", check...)
	if code != ExitFailure || !strings.Contains(stdout, filepath.Join(out, "kustomization.yaml")+": would create") ||
		!strings.Contains(stdout, "--- /dev/null") || !strings.Contains(stderr, "not what render writes") {
		t.Fatalf("--check before any render: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("--check created the output directory")
	}
	if code, _, stderr := runStdin(t, "", args...); code != ExitOK {
		t.Fatalf("render: exit %d: %s", code, stderr)
	}
	if code, stdout, stderr := runStdin(t, "", check...); code != ExitOK || stdout != "" {
		t.Fatalf("--check after render: exit %d\n%s%s", code, stdout, stderr)
	}

	// One file edited, one removed, one stale generated file added, and a
	// hand-written file (kept by render, so not reported).
	kust := filepath.Join(out, "kustomization.yaml")
	orig, err := os.ReadFile(kust)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(orig), "resources:", "resources: # edited", 1)
	mustWrite(t, kust, edited)
	mapData, err := os.ReadFile(bm)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(bm); err != nil {
		t.Fatal(err)
	}
	rlsFiles, err := filepath.Glob(filepath.Join(rls, "*.yaml"))
	if err != nil || len(rlsFiles) == 0 {
		t.Fatalf("rate limit config files: %v %v", rlsFiles, err)
	}
	generated, err := os.ReadFile(rlsFiles[0])
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(rls, "zz_old-domain.yaml"), string(generated))
	mustWrite(t, filepath.Join(out, "hand.yaml"), "kind: ConfigMap\n")

	code, stdout, stderr = runStdin(t, "", check...)
	for _, want := range []string{
		kust + ": would update", "-resources: # edited", "+resources:",
		bm + ": would create", "+" + strings.SplitN(string(mapData), "\n", 2)[0],
		filepath.Join(rls, "zz_old-domain.yaml") + ": would remove", "+++ /dev/null",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("--check output lacks %q", want)
		}
	}
	if code != ExitFailure || strings.Contains(stdout, "hand.yaml") || !strings.Contains(stderr, "3 files are not what render writes") {
		t.Errorf("--check on drifted files: exit %d\n%s%s", code, stdout, stderr)
	}
	if got, _ := os.ReadFile(kust); string(got) != edited {
		t.Fatal("--check rewrote a file")
	}
	if _, err := os.Stat(bm); err == nil {
		t.Fatal("--check wrote the budget map")
	}

	// --check compares files: with no output flag it is a usage error.
	if code, _, stderr := runStdin(t, "", "render", examplePath, "--check"); code != ExitUsage || !strings.Contains(stderr, "--check") {
		t.Fatalf("--check to stdout: exit %d: %s", code, stderr)
	}
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestRenderCheckBudgetMapInOutputDir: a budget map kept next to the
// manifests (-o DIR --budget-map DIR/budget-map.yaml) starts with render's
// generated header, but it is this run's output, not a stale manifest:
// render keeps it and --check must not report it for removal.
func TestRenderCheckBudgetMapInOutputDir(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	args := []string{"render", examplePath, "-o", out, "--budget-map", filepath.Join(out, "budget-map.yaml")}
	for i := 0; i < 2; i++ {
		if code, _, stderr := runStdin(t, "", args...); code != ExitOK {
			t.Fatalf("render: exit %d: %s", code, stderr)
		}
		if _, err := os.Stat(filepath.Join(out, "budget-map.yaml")); err != nil {
			t.Fatalf("render %d removed its own budget map: %v", i+1, err)
		}
	}
	if code, stdout, stderr := runStdin(t, "", append(args, "--check")...); code != ExitOK || stdout != "" {
		t.Fatalf("--check after render: exit %d\n%s%s", code, stdout, stderr)
	}
}
