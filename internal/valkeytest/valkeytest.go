// Package valkeytest starts real valkey-server processes on free loopback ports
// for tests. A test that needs Valkey fails (never skips) when CI=true and the
// binary is missing; on a developer machine without Valkey it skips with the
// install command.
package valkeytest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is one valkey-server process owned by a test.
type Server struct {
	Addr string // host:port on loopback
	Port int
	Dir  string // working directory (AOF, cluster config)
	args []string
	t    testing.TB

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Options tune a server. The zero value is a plain standalone server with no
// persistence.
type Options struct {
	// Args are extra valkey-server arguments, e.g. "--appendonly", "yes".
	Args []string
	// Port to listen on; 0 picks a free one.
	Port int
}

// Binary returns the path of a Valkey program (valkey-server, valkey-cli,
// valkey-sentinel), failing the test when CI=true and it is missing, skipping
// it otherwise.
func Binary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := fmt.Sprintf("%s not found on PATH; run hack/install-deps.sh", name)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer func() { _ = l.Close() }() // only used to pick a free port
	return l.Addr().(*net.TCPAddr).Port
}

// Start starts a valkey-server and registers its shutdown with t.Cleanup.
//
// A port picked by FreePort was free a moment ago, not now: on a busy machine
// another test (or, in cluster mode, its bus port at port+10000) can take it
// before valkey-server binds. When the port was picked here and the server
// exits saying the address is in use, Start picks another port and tries
// again (bounded); a port the caller chose is never changed.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	return startWith(t, opts, freeServerPort)
}

// startWith is Start with the port picker as a parameter, so a test can hand
// it a port that is already taken and check the retry.
func startWith(t testing.TB, opts Options, pick func(testing.TB, bool) int) *Server {
	t.Helper()
	Binary(t, "valkey-server")
	cluster := false
	for _, a := range opts.Args {
		if a == "--cluster-enabled" {
			cluster = true
		}
	}
	const attempts = 5
	for attempt := 1; ; attempt++ {
		port := opts.Port
		if port == 0 {
			port = pick(t, cluster)
		}
		dir := t.TempDir()
		args := []string{
			"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
			"--save", "", "--appendonly", "no", "--daemonize", "no",
			"--dir", dir, "--logfile", filepath.Join(dir, "valkey.log"),
		}
		args = append(args, opts.Args...)
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, Dir: dir, args: args, t: t}
		err := s.tryStart()
		if err == nil {
			t.Cleanup(s.Kill)
			return s
		}
		if opts.Port == 0 && errors.Is(err, errPortInUse) && attempt < attempts {
			t.Logf("valkey-server port %d was taken before it bound (attempt %d/%d); picking another", port, attempt, attempts)
			continue
		}
		t.Fatal(err)
	}
}

// errPortInUse marks a server that exited because its port (or cluster bus
// port) was taken between FreePort and its bind.
var errPortInUse = errors.New("address already in use")

// freeServerPort picks a free port; in cluster mode also one whose bus port
// (port+10000) is a valid port and free.
func freeServerPort(t testing.TB, cluster bool) int {
	t.Helper()
	for i := 0; i < 100; i++ {
		port := FreePort(t)
		if !cluster {
			return port
		}
		if port+10000 > 65535 {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		_ = l.Close()
		return port
	}
	t.Fatalf("no free port with a free cluster bus port (port+10000) after 100 tries")
	return 0
}

func (s *Server) start() {
	s.t.Helper()
	if err := s.tryStart(); err != nil {
		s.t.Fatal(err)
	}
}

// tryStart starts the process and waits until it answers PING. It returns
// early when the process exits (instead of polling a dead port for the whole
// timeout), wrapping errPortInUse when its log says the address is in use.
func (s *Server) tryStart() error {
	cmd := exec.Command("valkey-server", s.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start valkey-server: %w", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	err := waitReadyOrExit(s.Addr, 10*time.Second, exited)
	if err == nil {
		return nil
	}
	// Not Kill: it waits for the port to close, and the port may be held by
	// whoever took it.
	_ = cmd.Process.Kill()
	<-exited
	log, _ := os.ReadFile(filepath.Join(s.Dir, "valkey.log"))
	if strings.Contains(string(log), "Address already in use") {
		err = fmt.Errorf("%w: %v", errPortInUse, err)
	}
	return fmt.Errorf("valkey-server on %s not ready: %w\n%s", s.Addr, err, log)
}

// Restart starts the server again with the same port, directory and arguments
// (after Kill, for persistence and reconnection tests).
func (s *Server) Restart() { s.start() }

// Kill sends SIGKILL and waits for the port to close. Safe to call twice.
func (s *Server) Kill() { s.signal(syscall.SIGKILL) }

// Stop pauses the server with SIGSTOP (a stall: connections stay open, nothing answers).
func (s *Server) Stop() { s.signal(syscall.SIGSTOP) }

// Cont resumes a server paused by Stop.
func (s *Server) Cont() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	if sig == syscall.SIGKILL {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			c, err := net.DialTimeout("tcp", s.Addr, 50*time.Millisecond)
			if err != nil {
				return
			}
			_ = c.Close() // readiness probe only
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// Do runs one command with a plain RESP client (no library under test involved)
// and returns the reply line(s) as text. Good enough for INCR/GET/CONFIG/CLUSTER
// style checks in tests.
func (s *Server) Do(args ...string) (string, error) { return Do(s.Addr, args...) }

// Do sends one command to addr and returns the reply as text.
// Integers and simple strings are returned bare, bulk strings as their content,
// nil as "(nil)", arrays as their elements joined by newlines.
func Do(addr string, args ...string) (string, error) { return DoAuth(addr, "", args...) }

// DoAuth is Do on a connection first authenticated with AUTH password (the
// default user); an empty password sends no AUTH.
func DoAuth(addr, password string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }() // one-shot admin connection; the reply is checked
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	cmds := [][]string{args}
	if password != "" {
		cmds = [][]string{{"AUTH", password}, args}
	}
	var b strings.Builder
	for _, cmd := range cmds {
		fmt.Fprintf(&b, "*%d\r\n", len(cmd))
		for _, a := range cmd {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	if password != "" {
		if _, err := readReply(r); err != nil {
			return "", fmt.Errorf("AUTH: %w", err)
		}
	}
	return readReply(r)
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("valkey: %s", line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "(nil)", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		parts := make([]string, 0, max(n, 0))
		for i := 0; i < n; i++ {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return line, nil
}

// WaitReady polls addr with PING until it answers PONG or timeout passes.
func WaitReady(addr string, timeout time.Duration) error {
	return waitReadyOrExit(addr, timeout, nil)
}

// waitReadyOrExit is WaitReady that also stops when exited is closed (the
// process died, so waiting longer cannot help).
func waitReadyOrExit(addr string, timeout time.Duration, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		out, err := Do(addr, "PING")
		if err == nil && out == "PONG" {
			return nil
		}
		last = err
		select {
		case <-exited:
			return fmt.Errorf("process exited: %v", last)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("timeout after %s: %v", timeout, last)
}
