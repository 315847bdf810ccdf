// Package install checks the binaries as a user installs them: built with
// the release -ldflags, they say their version, commit and Go version;
// ratelimit --help exits 0 and describes the service; the SARIF of an assert
// run on stdin carries the release version and a valid URI for stdin.
package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const release = "v9.8.7-test"

func build(t *testing.T, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-ldflags", "-X github.com/budgetgen/budgetgen/internal/buildinfo.Version="+release, "-o", out, pkg)
	cmd.Dir = "../.."
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

func run(t *testing.T, bin string, stdin []byte, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

func TestReleaseBinaries(t *testing.T) {
	dir := t.TempDir()
	bg := build(t, dir, "./cmd/budgetgen")
	rl := build(t, dir, "./cmd/ratelimit")

	for name, args := range map[string][]string{bg: {"version"}, rl: {"--version"}} {
		code, out, errOut := run(t, name, nil, args...)
		tool := filepath.Base(name)
		if code != 0 || !strings.HasPrefix(out, tool+" "+release+"\ncommit: ") || !strings.Contains(out, "\ngo: "+runtime.Version()) {
			t.Errorf("%s %v: exit %d\n%s%s", tool, args, code, out, errOut)
		}
	}
	code, out, errOut := run(t, rl, nil, "--help")
	if code != 0 || !strings.Contains(errOut+out, "drop-in for envoyproxy/ratelimit") || !strings.Contains(errOut+out, "-redis-url") {
		t.Errorf("ratelimit --help: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, _ := run(t, rl, nil, "--no-such-flag"); code != 2 {
		t.Errorf("ratelimit with a bad flag: exit %d, want 2", code)
	}

	// assert on stdin, as SARIF.
	input, err := os.ReadFile("../../pkg/assert/testdata/rules/bg001_not_shared.yaml")
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, bg, input, "assert", "-o", "sarif", "--skip", "BG007", "-")
	if code != 1 {
		t.Fatalf("assert: exit %d\n%s", code, errOut)
	}
	var doc struct {
		Runs []struct {
			Tool struct {
				Driver struct{ Version string }
			}
			Results []struct {
				Locations []struct {
					PhysicalLocation struct {
						ArtifactLocation struct{ URI string }
					}
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Runs) != 1 || len(doc.Runs[0].Results) == 0 {
		t.Fatalf("sarif: %v\n%s", err, out)
	}
	if v := doc.Runs[0].Tool.Driver.Version; v != release {
		t.Errorf("SARIF tool version %q, want %q", v, release)
	}
	for _, r := range doc.Runs[0].Results {
		if uri := r.Locations[0].PhysicalLocation.ArtifactLocation.URI; uri != "file:///dev/stdin" {
			t.Errorf("stdin location %q", uri)
		}
	}
}
