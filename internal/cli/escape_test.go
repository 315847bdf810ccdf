package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMessagesEscapeFileNames: a spec file name holding a newline and a
// workflow command, in an error on stderr and in promote's message on
// stdout, does not make a line a GitHub runner would execute.
func TestMessagesEscapeFileNames(t *testing.T) {
	dir := t.TempDir()
	evil := filepath.Join(dir, "spec\n::error file=x::forged\x1b[2K.yaml")
	if err := os.WriteFile(evil, []byte("apiVersion: budgetgen.io/v1alpha1\nkind: Nonsense\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"render", evil}, {"render", evil + ".missing"}, {"assert", "--spec", evil, evil}, {"promote", "run", "--spec", evil}} {
		code, stdout, stderr := runStdin(t, "", args...)
		if code == 0 {
			t.Errorf("%v: exit 0", args[0])
		}
		// Errors of our own keep the name on one line; an OS error
		// (the missing file) is only made safe line by line.
		if !strings.HasSuffix(args[1], ".missing") && !strings.Contains(stdout+stderr, `spec\n::error file=x::forged\x1b[2K.yaml`) {
			t.Errorf("%v: escaped file name not in output:\n%s%s", args[0], stdout, stderr)
		}
		for _, l := range strings.Split(stdout+"\n"+stderr, "\n") {
			if strings.HasPrefix(strings.TrimLeft(l, " \t"), "::") || strings.Contains(l, "\x1b") {
				t.Errorf("%v: unsafe output line %q", args[0], l)
			}
		}
	}
}
