package cli

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A shadowSince still ahead (a year typo) is warned about at render, with
// its line, instead of a week later when promote refuses the budget; a past
// one says nothing, and the render goes on either way.
func TestRenderWarnsOfAFutureShadowSince(t *testing.T) {
	src, err := os.ReadFile("../../examples/budgets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Index(string(src), "name: agent-fleet")
	if line < 0 {
		t.Fatal("examples/budgets.yaml no longer has agent-fleet")
	}
	n := strings.Count(string(src[:line]), "\n") + 1
	future := string(src[:line]) + strings.Replace(string(src[line:]), "shadowSince: 2026-10-16", "shadowSince: 2996-10-16", 1)
	path := filepath.Join(t.TempDir(), "budgets.yaml")
	if err := os.WriteFile(path, []byte(future), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runStdin(t, "", "render", path)
	want := path + ":" + strconv.Itoa(n) + ": spec.budgets[1].shadowSince: budget agent-fleet has shadowSince 2996-10-16, after today"
	if code != 0 || !strings.Contains(stdout, "BackendTrafficPolicy") || !strings.Contains(stderr, want) {
		t.Errorf("exit %d, stderr:\n%s\nwant %q", code, stderr, want)
	}
	if strings.Count(stderr, "after today") != 1 {
		t.Errorf("past shadowSince dates warned too:\n%s", stderr)
	}
}
