// Package valkeytest starts real valkey-server processes on free loopback ports
// for tests. A test that needs Valkey fails (never skips) when CI=true and the
// binary is missing; on a developer machine without Valkey it skips with the
// install command.
package valkeytest

import (
	"bufio"
	"context"
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
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start starts a valkey-server and registers its shutdown with t.Cleanup.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	Binary(t, "valkey-server")
	port := opts.Port
	if port == 0 {
		port = FreePort(t)
	}
	dir := t.TempDir()
	args := []string{
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "valkey.log"),
	}
	args = append(args, opts.Args...)
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, Dir: dir, args: args, t: t}
	s.start()
	t.Cleanup(s.Kill)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	cmd := exec.Command("valkey-server", s.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start valkey-server: %v", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	go func() { _ = cmd.Wait() }()
	if err := WaitReady(s.Addr, 10*time.Second); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.Dir, "valkey.log"))
		s.t.Fatalf("valkey-server on %s not ready: %v\n%s", s.Addr, err, log)
	}
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
			c.Close()
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
	defer c.Close()
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
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		out, err := Do(addr, "PING")
		if err == nil && out == "PONG" {
			return nil
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("timeout after %s: %v", timeout, last)
}
