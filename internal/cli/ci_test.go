package cli

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
)

// TestConcurrentPromotionsLoseNothing: two promote runs on one spec at the
// same moment (two CI jobs), each for another budget, 50 times: both exit 0
// and both promotions are in the file every time.
func TestConcurrentPromotionsLoseNothing(t *testing.T) {
	for trial := range 50 {
		p := copyExample(t)
		var wg sync.WaitGroup
		codes := make([]int, 2)
		stderrs := make([]string, 2)
		start := make(chan struct{})
		for i, budget := range []string{"per-run", "per-human"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				codes[i], _, stderrs[i] = runCLI(t, "promote", budget, "--spec", p, "--now", "2026-10-24T08:00:00Z", "--force", "--reason", "ci")
			}()
		}
		close(start)
		wg.Wait()
		if codes[0] != ExitOK || codes[1] != ExitOK {
			t.Fatalf("trial %d: exit codes %v: %q", trial, codes, stderrs)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			"{name: per-run,     perPrincipal: x-ar-run,                    tokensPerDay: 5000000,   mode: enforce, enforcedSince: 2026-10-24, promotionReason: \"ci\"",
			"{name: per-human,   perPrincipal: x-ar-human,                  tokensPerDay: 2000000,   mode: enforce, enforcedSince: 2026-10-24, promotionReason: \"ci\"",
		} {
			if !strings.Contains(string(b), want) {
				t.Fatalf("trial %d: a promotion was lost: %q missing from\n%s", trial, want, b)
			}
		}
		if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 1 {
			t.Fatalf("trial %d: debris next to the spec: %v", trial, ents)
		}
	}
}

// TestRenderWritesBothOutputsOrNeither: when --ratelimit-config cannot be
// written, -o is not written either (both are staged before either is
// committed), and no temporary file is left in -o.
func TestRenderWritesBothOutputsOrNeither(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "rendered")
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A path under a regular file: creating anything there fails with
	// ENOTDIR, even for root.
	code, _, stderr := runCLI(t, "render", examplePath, "-o", out, "--ratelimit-config", filepath.Join(blocker, "rls"))
	if code == ExitOK {
		t.Fatal("render succeeded writing under a regular file")
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("-o %s was written although --ratelimit-config failed (%v): %s", out, err, stderr)
	}
	// An existing -o keeps its old content.
	if code, _, stderr := runCLI(t, "render", examplePath, "-o", out); code != ExitOK {
		t.Fatalf("render: %s", stderr)
	}
	before := snapshot(t, out)
	old := filepath.Join(out, "kustomization.yaml")
	if err := os.WriteFile(old, append(before["kustomization.yaml"], []byte("# edited\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	before = snapshot(t, out)
	if code, _, _ := runCLI(t, "render", examplePath, "-o", out, "--ratelimit-config", filepath.Join(blocker, "rls")); code == ExitOK {
		t.Fatal("render succeeded")
	}
	after := snapshot(t, out)
	if len(after) != len(before) {
		t.Fatalf("files in -o changed: %d -> %d", len(before), len(after))
	}
	for name, b := range before {
		if string(after[name]) != string(b) {
			t.Errorf("%s changed although the other output failed", name)
		}
	}
	// Both directories writable: both are written.
	rls := filepath.Join(dir, "rls")
	if code, _, stderr := runCLI(t, "render", examplePath, "-o", out, "--ratelimit-config", rls); code != ExitOK {
		t.Fatalf("render: %s", stderr)
	}
	if len(snapshot(t, rls)) == 0 || strings.Contains(string(snapshot(t, out)["kustomization.yaml"]), "# edited") {
		t.Error("a successful render did not write both outputs")
	}
}

// TestRenderWritesAllThreeOutputsOrNone: when --budget-map cannot be
// written, neither -o nor --ratelimit-config is; with everything writable,
// all three are, and the map's directory keeps the files already in it.
func TestRenderWritesAllThreeOutputsOrNone(t *testing.T) {
	dir := t.TempDir()
	out, rls := filepath.Join(dir, "rendered"), filepath.Join(dir, "rls")
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runCLI(t, "render", examplePath, "-o", out, "--ratelimit-config", rls, "--budget-map", filepath.Join(blocker, "map", "budget-map.yaml"))
	if code == ExitOK {
		t.Fatal("render succeeded writing the map under a regular file")
	}
	for _, p := range []string{out, rls} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was written although --budget-map failed (%v): %s", p, err, stderr)
		}
	}
	if code, _, stderr := runCLI(t, "render", examplePath, "-o", out, "--ratelimit-config", rls, "--budget-map", dir); code != ExitUsage || !strings.Contains(stderr, "is a directory") {
		t.Errorf("--budget-map naming a directory: exit %d, stderr %s", code, stderr)
	}
	mapDir := filepath.Join(dir, "maps")
	if err := os.MkdirAll(mapDir, 0o755); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(mapDir, "README")
	if err := os.WriteFile(other, []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCLI(t, "render", examplePath, "-o", out, "--ratelimit-config", rls, "--budget-map", filepath.Join(mapDir, "budget-map.yaml")); code != ExitOK {
		t.Fatalf("render: %s", stderr)
	}
	got := snapshot(t, mapDir)
	if string(got["README"]) != "kept" || !strings.Contains(string(got["budget-map.yaml"]), "kind: BudgetMap") || len(got) != 2 {
		t.Errorf("map directory after render: %v files, README %q", len(got), got["README"])
	}
	if len(snapshot(t, out)) == 0 {
		t.Error("-o not written")
	}
}

func snapshot(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]byte{}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".budgetgen-tmp-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = b
	}
	return m
}

// TestPromoteWaitsForTheLockUntilCancelled: a promote that cannot get the
// spec's lock waits, and a cancelled context (SIGTERM in main) ends the wait
// with ExitInterrupted and the file untouched.
func TestPromoteWaitsForTheLockUntilCancelled(t *testing.T) {
	p := copyExample(t)
	before, _ := os.ReadFile(p)
	unlock, err := atomicfile.Lock(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errb strings.Builder
	go func() {
		done <- Run(ctx, []string{"promote", "per-run", "--spec", p, "--now", "2026-10-24T08:00:00Z", "--force", "--reason", "ci"}, strings.NewReader(""), &strings.Builder{}, &errb)
	}()
	select {
	case code := <-done:
		t.Fatalf("promote did not wait for the lock: exit %d %s", code, errb.String())
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	if code := <-done; code != ExitInterrupted {
		t.Fatalf("exit %d, want %d: %s", code, ExitInterrupted, errb.String())
	}
	if after, _ := os.ReadFile(p); string(after) != string(before) {
		t.Error("spec changed")
	}
}

// TestStdinReadStopsOnCancel: render reading a stdin that never ends
// returns ExitInterrupted once the context is cancelled.
func TestStdinReadStopsOnCancel(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	defer r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errb strings.Builder
	go func() { done <- Run(ctx, []string{"render", "-"}, r, &strings.Builder{}, &errb) }()
	if _, err := w.Write([]byte("apiVersion: budgetgen.dev/v1alpha1\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		t.Fatalf("render did not wait for stdin: exit %d %s", code, errb.String())
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	if code := <-done; code != ExitInterrupted || !strings.Contains(errb.String(), "stopped") {
		t.Fatalf("exit %d, want %d: %s", code, ExitInterrupted, errb.String())
	}
}
