// Package hack holds the scripts that build, lint and test the project; this
// test checks how hack/fuzz.sh reads a failed fuzz run, on logs Go printed.
package hack

import (
	"os/exec"
	"strings"
	"testing"
)

// run sources fuzzlib.sh and runs one of its functions on a log.
func run(t *testing.T, fn, log string) (string, bool) {
	t.Helper()
	out, err := exec.Command("bash", "-c", `. ./fuzzlib.sh && `+fn+` "$1"`, "bash", log).CombinedOutput()
	if _, exit := err.(*exec.ExitError); err != nil && !exit {
		t.Fatalf("bash: %v", err)
	}
	return strings.TrimSpace(string(out)), err == nil
}

func TestCoordinatorRace(t *testing.T) {
	for _, tc := range []struct {
		log  string
		race bool
	}{
		// CI, 2026-12-01: FuzzParse failed at its 6 s deadline, nothing written.
		{"testdata/fuzz-race.log", true},
		// A real crasher: it must fail the stage, never be retried away.
		{"testdata/fuzz-crash.log", false},
	} {
		if _, got := run(t, "coordinator_race", tc.log); got != tc.race {
			t.Errorf("coordinator_race(%s) = %v, want %v", tc.log, got, tc.race)
		}
	}
}

func TestExecsSeen(t *testing.T) {
	if got, _ := run(t, "execs_seen", "testdata/fuzz-race.log"); got != "6886" {
		t.Errorf("execs_seen = %q, want 6886", got)
	}
	if got, _ := run(t, "execs_seen", "testdata/fuzz-crash.log"); got != "" {
		t.Errorf("execs_seen on a log with no count = %q, want empty", got)
	}
}
