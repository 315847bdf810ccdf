// Package pgtest starts a real PostgreSQL server (Debian's postgresql
// package: initdb and postgres) on a free loopback port for tests, in a
// temporary data directory removed afterwards. A test that needs PostgreSQL
// fails (never skips) when CI=true and the binaries are missing; on a
// developer machine without them it skips with the install command.
//
// PostgreSQL refuses to run as root: when the test runs as root (CI does),
// initdb and postgres run as the unprivileged user "nobody" (the process
// credentials are set when starting them, as `runuser -u nobody` would), in a
// data directory owned by that user.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Server is one postgres process owned by a test.
type Server struct {
	// DSN connects as the superuser "postgres" to database "postgres"
	// over TCP on 127.0.0.1, without TLS (loopback only).
	DSN  string
	Port int
	Dir  string

	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// runAs is how initdb and postgres run: as "nobody" when this process is root.
type runAs struct{ cred *syscall.Credential }

// BinDir returns the directory holding initdb and postgres: `pg_config
// --bindir` when it has them, else the newest /usr/lib/postgresql/*/bin
// (Debian keeps the server binaries off PATH), else PATH. It fails the test
// under CI=true when there is none and skips it otherwise.
func BinDir(t testing.TB) string {
	t.Helper()
	var cands []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		cands = append(cands, strings.TrimSpace(string(out)))
	}
	debian, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(debian, func(i, j int) bool { return version(debian[i]) > version(debian[j]) })
	cands = append(cands, debian...)
	if p, err := exec.LookPath("postgres"); err == nil {
		cands = append(cands, filepath.Dir(p))
	}
	for _, d := range cands {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d
		}
	}
	msg := "PostgreSQL server binaries (initdb, postgres) not found; run hack/install-deps.sh (Debian package postgresql)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// Start initialises a cluster and starts postgres on a free port; the
// server is stopped and its directory removed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := BinDir(t)
	as, err := credentials()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(as.tempBase(), "pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) }) // best effort: the temp dir
	if err := as.own(dir); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	as.apply(initdb, dir)
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	const attempts = 5
	for attempt := 1; ; attempt++ {
		s, err := start(bin, dir, data, freePort(t), as)
		if err == nil {
			t.Cleanup(s.stop)
			return s
		}
		if !errors.Is(err, errPortInUse) || attempt == attempts {
			t.Fatal(err)
		}
		t.Logf("postgres: port taken before it bound (attempt %d/%d); picking another", attempt, attempts)
	}
}

var errPortInUse = errors.New("port in use")

// start runs postgres and waits until it accepts connections (bounded).
func start(bin, dir, data string, port int, as runAs) (*Server, error) {
	logFile := filepath.Join(dir, fmt.Sprintf("postgres-%d.log", port))
	lf, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	defer func() { _ = lf.Close() }() // the child has its own descriptor
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-k", dir, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off")
	cmd.Stdout, cmd.Stderr = lf, lf
	as.apply(cmd, dir)
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	s := &Server{Port: port, Dir: dir, cmd: cmd, done: make(chan struct{}), log: logFile,
		DSN: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)}
	go func() { _ = cmd.Wait(); close(s.done) }() // the exit is read through done
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			msg := s.logTail()
			if strings.Contains(msg, "Address already in use") {
				return nil, fmt.Errorf("%w: %d", errPortInUse, port)
			}
			return nil, fmt.Errorf("postgres exited: %s", msg)
		case <-time.After(100 * time.Millisecond):
		}
		if s.ready() {
			return s, nil
		}
	}
	s.stop()
	return nil, fmt.Errorf("postgres not ready after 60 s: %s", s.logTail())
}

// ready reports whether the server says it accepts connections and its
// port answers.
func (s *Server) ready() bool {
	b, _ := os.ReadFile(s.log)
	if !bytes.Contains(b, []byte("ready to accept connections")) {
		return false
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)), time.Second)
	if err != nil {
		return false
	}
	_ = c.Close() // only a probe
	return true
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// stop asks for a fast shutdown (SIGINT), then kills the process group.
func (s *Server) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT) // fast shutdown; the wait below covers a failure
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL) // its own process group
		<-s.done
	}
}

// Psql runs one SQL statement through psql (for tests that check the
// server with its own client) and returns its unaligned output.
func (s *Server) Psql(ctx context.Context, t testing.TB, sql string) string {
	t.Helper()
	bin := BinDir(t)
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "psql"), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", s.DSN, "-c", sql)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("psql %q: %v\n%s", sql, err, out)
	}
	return strings.TrimSpace(string(out))
}

// credentials returns how to run the server: as this user, or as "nobody"
// when this process is root (PostgreSQL refuses root).
func credentials() (runAs, error) {
	if os.Geteuid() != 0 {
		return runAs{}, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return runAs{}, fmt.Errorf("running as root, and PostgreSQL refuses root: no user nobody to run it as: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return runAs{}, fmt.Errorf("user nobody: uid %q gid %q", u.Uid, u.Gid)
	}
	return runAs{cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}, nil
}

// tempBase is where the data directory goes: the temp directory, unless
// the server runs as another user who cannot reach it (a $TMPDIR under
// root's home): then /tmp.
func (a runAs) tempBase() string {
	base := os.TempDir()
	if a.cred == nil {
		return ""
	}
	for d := base; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return "/tmp"
		}
		if d == filepath.Dir(d) {
			return base
		}
	}
}

// own gives dir to the server's user.
func (a runAs) own(dir string) error {
	if a.cred == nil {
		return nil
	}
	return os.Chown(dir, int(a.cred.Uid), int(a.cred.Gid))
}

// apply runs cmd as the server's user, from dir (which that user owns:
// nobody's home is not writable, and the caller's working directory may
// not be reachable).
func (a runAs) apply(cmd *exec.Cmd, dir string) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: a.cred}
	if a.cred != nil {
		cmd.Env = append(os.Environ(), "HOME="+dir)
		cmd.Dir = dir
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer func() { _ = l.Close() }() // only used to pick a free port
	return l.Addr().(*net.TCPAddr).Port
}

// AddPasswordRole creates a login role that must authenticate with
// password (scram-sha-256, over TCP from 127.0.0.1): a rule for it goes
// before the cluster's trust rules in pg_hba.conf, and the server reloads
// its configuration. It returns once a wrong password is refused.
func (s *Server) AddPasswordRole(ctx context.Context, t testing.TB, role, password string) {
	t.Helper()
	s.Psql(ctx, t, fmt.Sprintf(`SET password_encryption = 'scram-sha-256'; CREATE ROLE %q LOGIN SUPERUSER PASSWORD '%s'`, role, strings.ReplaceAll(password, "'", "''")))
	hba := filepath.Join(s.Dir, "data", "pg_hba.conf")
	old, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	rule := fmt.Sprintf("host all %q 127.0.0.1/32 scram-sha-256\n", role)
	if err := os.WriteFile(hba, append([]byte(rule), old...), 0o600); err != nil {
		t.Fatal(err)
	}
	s.Psql(ctx, t, "SELECT pg_reload_conf()")
	bin := BinDir(t)
	dsn := fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", role, s.Port)
	err = waitUntil(10*time.Second, func() bool {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "psql"), "-X", "-w", "-d", dsn, "-c", "SELECT 1")
		cmd.Env = append(os.Environ(), "PGPASSWORD="+password+"-wrong")
		return cmd.Run() != nil
	})
	if err != nil {
		t.Fatalf("postgres still lets role %s in without its password: %v", role, err)
	}
}

// waitUntil polls cond every 50 ms until it holds or timeout passes.
func waitUntil(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}
