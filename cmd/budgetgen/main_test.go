package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain runs the real main when re-executed by a test
// (BUDGETGEN_RUN_MAIN=1), so signals go through main's NotifyContext.
func TestMain(m *testing.M) {
	if os.Getenv("BUDGETGEN_RUN_MAIN") == "1" {
		os.Args = append([]string{"budgetgen"}, strings.Split(os.Getenv("BUDGETGEN_ARGS"), "\x1f")...)
		// Every package is initialised: tell the test (fd 3) that main,
		// whose first act is signal.NotifyContext, runs next.
		if ready := os.NewFile(3, "ready"); ready != nil {
			_, _ = ready.WriteString("main\n")
			ready.Close()
		}
		main()
		return
	}
	os.Exit(m.Run())
}

// TestSIGTERMWhileBlockedOnInput: budgetgen blocked opening a FIFO without
// a writer, or reading a stdin that never ends, exits on SIGTERM with 130
// and writes nothing.
func TestSIGTERMWhileBlockedOnInput(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "spec.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	for _, c := range []struct {
		name  string
		args  []string
		stdin bool
	}{
		{"render from a FIFO", []string{"render", fifo, "-o", out}, false},
		{"render from stdin", []string{"render", "-", "-o", out}, true},
		{"assert from stdin", []string{"assert", "-"}, true},
		{"assert a FIFO", []string{"assert", fifo}, false},
		{"promote a FIFO", []string{"promote", "x", "--spec", fifo, "--force", "--reason", "r"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "BUDGETGEN_RUN_MAIN=1", "BUDGETGEN_ARGS="+strings.Join(c.args, "\x1f"))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			var w *os.File
			if c.stdin {
				r, pw, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				defer pw.Close()
				cmd.Stdin, w = r, pw
			}
			readyR, readyW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer readyR.Close()
			cmd.ExtraFiles = []*os.File{readyW} // fd 3 in the child
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if w != nil {
				_, _ = w.WriteString("apiVersion: budgetgen.dev/v1alpha1\n") // some input, no EOF
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			// On a busy machine the child's package initialisation can take
			// long: wait for its note that main is about to run, then give
			// it time to block on the input.
			readyW.Close()
			if line, err := bufio.NewReader(readyR).ReadString('\n'); err != nil || line != "main\n" {
				cmd.Process.Kill()
				t.Fatalf("child did not reach main: %q %v", line, err)
			}
			select {
			case err := <-exited:
				t.Fatalf("exited before the signal (%v): %s", err, stderr.String())
			case <-time.After(300 * time.Millisecond): // blocked, as wanted
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 130 {
					t.Fatalf("exit %v, want status 130: %s", err, stderr.String())
				}
				if !strings.Contains(stderr.String(), "stopped") {
					t.Errorf("stderr does not say it stopped: %s", stderr.String())
				}
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				t.Fatal("SIGTERM ignored: still running after 30 s")
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("-o written: %v", err)
			}
		})
	}
}
