package atomicfile

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMain lets a test re-run this binary as a writer that is killed in the
// middle of a write (BUDGETGEN_ATOMICFILE_HELPER=dir).
func TestMain(m *testing.M) {
	if dir := os.Getenv("BUDGETGEN_ATOMICFILE_HELPER"); dir != "" {
		// Stage a write and hang before committing: SIGKILL now leaves the
		// debris a real `render -o` would.
		if _, err := StageDir(dir, map[string][]byte{"a.yaml": []byte("half")}, Options{}); err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString("staged\n")
		time.Sleep(time.Hour) // stays: the child hangs until the test kills it
	}
	os.Exit(m.Run())
}

// TestKilledWriterDebrisIsCleanedOnNextWrite: a writer killed with SIGKILL
// between staging and commit leaves .budgetgen-tmp-* files; the next write
// into that directory removes them (the writer's pid is dead), while the
// temporary file of a live writer and files not of our pattern stay.
func TestKilledWriterDebrisIsCleanedOnNextWrite(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BUDGETGEN_ATOMICFILE_HELPER="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "staged\n" {
		cmd.Process.Kill()
		t.Fatalf("helper: %q", line)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	debris := tempsIn(t, dir)
	if len(debris) != 1 || !strings.HasPrefix(debris[0], tempPrefix+strconv.Itoa(cmd.Process.Pid)+"-") {
		t.Fatalf("killed writer left %v, want one temp file named with its pid", debris)
	}
	// A live writer's file (ours: this process) and a foreign dotfile.
	live := filepath.Join(dir, tempPrefix+strconv.Itoa(os.Getpid())+"-inprogress")
	foreign := filepath.Join(dir, ".other-tmp-1")
	for _, p := range []string{live, foreign} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := WriteDir(dir, map[string][]byte{"b.yaml": []byte("b")}, Options{}); err != nil {
		t.Fatal(err)
	}
	if got := tempsIn(t, dir); !slices.Equal(got, []string{filepath.Base(live)}) {
		t.Errorf("after the next write: temp files %v, want only the live writer's", got)
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Errorf("a file not of our pattern was removed: %v", err)
	}
	// Once older than the safe age, even a live pid's file is debris (pids
	// are reused); so is a legacy name without a pid.
	legacy := filepath.Join(dir, tempPrefix+"123abc")
	if err := os.WriteFile(legacy, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(dir, tempPrefix+"456def")
	if err := os.WriteFile(fresh, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	for _, p := range []string{live, legacy} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	if err := WriteFile(filepath.Join(dir, "c.yaml"), []byte("c"), Options{}); err != nil {
		t.Fatal(err)
	}
	if got := tempsIn(t, dir); !slices.Equal(got, []string{filepath.Base(fresh)}) {
		t.Errorf("after WriteFile: temp files %v, want only the fresh legacy one", got)
	}
}

// TestDebrisOfAnEarlierProcessWithOurPid: in a container the service is
// pid 1 each time it starts, so a file named with our pid but written before
// this process started is a killed predecessor's debris and goes at the next
// write (each crash would otherwise leave a snapshot-sized file for an
// hour); one written since this process started is a write in progress.
func TestDebrisOfAnEarlierProcessWithOurPid(t *testing.T) {
	dir := t.TempDir()
	earlier := filepath.Join(dir, tempPrefix+strconv.Itoa(os.Getpid())+"-killed")
	current := filepath.Join(dir, tempPrefix+strconv.Itoa(os.Getpid())+"-inprogress")
	for _, p := range []string{earlier, current} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	before := processStart.Add(-time.Second)
	if err := os.Chtimes(earlier, before, before); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(filepath.Join(dir, "snap"), []byte("s"), Options{}); err != nil {
		t.Fatal(err)
	}
	if got := tempsIn(t, dir); !slices.Equal(got, []string{filepath.Base(current)}) {
		t.Errorf("temp files after the next write: %v, want only %s", got, filepath.Base(current))
	}
}

func tempsIn(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	for _, n := range list(t, dir) {
		if strings.HasPrefix(n, tempPrefix) {
			names = append(names, n)
		}
	}
	return names
}

// TestStageThenAbort: staged files are invisible until Commit; Abort
// removes them and a directory the staging created.
func TestStageThenAbort(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "new")
	st, err := StageDir(dir, map[string][]byte{"a.yaml": []byte("a")}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a.yaml")); err == nil {
		t.Fatal("staged file visible before Commit")
	}
	st.Abort()
	st.Abort()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("aborted staging left %s (%v)", dir, err)
	}
	st, err = StageDir(dir, map[string][]byte{"a.yaml": []byte("a")}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(); err != nil {
		t.Fatal(err)
	}
	st.Abort() // after Commit: a no-op
	if b, err := os.ReadFile(filepath.Join(dir, "a.yaml")); err != nil || string(b) != "a" {
		t.Fatalf("committed file: %q %v", b, err)
	}
	var none *Staged
	none.Abort()
	if err := none.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestLockExcludes: while one holder has the lock, another Lock waits; it
// gets the lock when released, and gives up when its context ends.
func TestLockExcludes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "spec.yaml")
	unlock, err := Lock(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := Lock(ctx, p); err == nil {
		t.Fatal("second Lock succeeded while the first was held")
	}
	var mu sync.Mutex
	got := false
	done := make(chan struct{})
	go func() {
		defer close(done)
		u, err := Lock(context.Background(), p)
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		got = true
		mu.Unlock()
		u()
	}()
	time.Sleep(30 * time.Millisecond) // stays: time for a Lock that does not wait to return
	mu.Lock()
	early := got
	mu.Unlock()
	if early {
		t.Fatal("Lock did not wait for the holder")
	}
	unlock()
	<-done
}
