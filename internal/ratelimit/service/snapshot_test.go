package service

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
	"github.com/budgetgen/budgetgen/internal/syncbuf"
)

const snapConfig = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1000000}\n"

// charge sends one request for user with hits_addend n and returns what
// remains of the day's 1,000,000.
func chargeUser(t *testing.T, c rlpb.RateLimitServiceClient, user string, n uint32) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "d", HitsAddend: n, Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: user}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Statuses[0].LimitRemaining
}

// runInProcess starts the service (Run) and returns a client and a stop
// function that ends it cleanly (as SIGTERM does) and returns Run's error.
func runInProcess(t *testing.T, dir string, env map[string]string) (rlpb.RateLimitServiceClient, func() error) {
	t.Helper()
	base := map[string]string{"PORT": "0", "GRPC_PORT": "0", "DEBUG_PORT": "0", "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1", "XDG_STATE_HOME": t.TempDir()}
	for k, v := range env {
		base[k] = v
	}
	logs := &syncbuf.Buffer{}
	ready := make(chan *server.Server, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"--config-dir", dir}, func(k string) string { return base[k] }, logs, func(s *server.Server) { ready <- s })
	}()
	var srv *server.Server
	select {
	case srv = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("service exited: %v\n%s", err, logs)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatalf("service did not start\n%s", logs)
	}
	g, _, _, _ := srv.Addrs()
	conn, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		conn.Close()
		cancel()
		return <-done
	}
	t.Cleanup(func() { _ = stop() })
	return rlpb.NewRateLimitServiceClient(conn), stop
}

// TestSnapshotCleanRestart: 900,000 of a 1,000,000 day budget spent, the
// service stopped cleanly and started again with the default snapshot
// settings (the state directory is a temporary one here): 100,000 remain,
// not 999,999. The interval is an hour, so only the shutdown snapshot can
// carry it.
func TestSnapshotCleanRestart(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, "d.yaml", snapConfig)
	env := map[string]string{"XDG_STATE_HOME": t.TempDir(), "MEMORY_SNAPSHOT_INTERVAL": "1h"}
	c, stop := runInProcess(t, dir, env)
	for range 9 {
		chargeUser(t, c, "alice", 100_000)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	c, _ = runInProcess(t, dir, env)
	if got := chargeUser(t, c, "alice", 1); got != 99_999 {
		t.Fatalf("after a clean restart: %d remaining, want 99,999", got)
	}
	if got := chargeUser(t, c, "bob", 1); got != 999_999 {
		t.Fatalf("another principal: %d remaining", got)
	}
}

// TestSnapshotCorruptStops: a corrupt snapshot stops the start with an
// error naming the file; nothing is served with a forgotten budget.
func TestSnapshotCorruptStops(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, "d.yaml", snapConfig)
	path := filepath.Join(t.TempDir(), "snap")
	if err := os.WriteFile(path, []byte("BGMEMSNAP\x01garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	env := map[string]string{"PORT": "0", "GRPC_PORT": "0", "DEBUG_PORT": "0", "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1", "MEMORY_SNAPSHOT_PATH": path}
	err := Run(context.Background(), []string{"--config-dir", dir}, func(k string) string { return env[k] }, logs, nil)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("err = %v, want a corrupt-snapshot error naming %s", err, path)
	}
}

// TestSnapshotSIGKILL: the service as a real process with default settings
// (its state directory a temporary one). It says at start where it keeps
// state; SIGTERM loses nothing (exit 0, every hit back after the restart);
// SIGKILL: what was charged at least one interval before the kill survives,
// at most what was charged in the last interval is lost
// (docs/reliability.md).
func TestSnapshotSIGKILL(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ratelimit")
	build := exec.Command("go", "build", "-o", bin, "github.com/budgetgen/budgetgen/cmd/ratelimit")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	writeConfig(t, dir, "d.yaml", snapConfig)
	state := t.TempDir()
	path := filepath.Join(state, "budgetgen", "ratelimit-memory-0.snapshot") // the default, GRPC_PORT 0
	const interval = 10 * time.Second                                        // the default
	start := func() (rlpb.RateLimitServiceClient, *exec.Cmd) {
		cmd := exec.Command(bin, "--config-dir", dir)
		cmd.Env = append(withoutEnv(os.Environ(), "MEMORY_SNAPSHOT_PATH", "MEMORY_SNAPSHOT_INTERVAL", "REDIS_URL"), "PORT=0", "GRPC_PORT=0", "DEBUG_PORT=0", "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
			"LOG_FORMAT=json", "SHUTDOWN_DELAY=0s", "XDG_STATE_HOME="+state)
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		addr, kept := make(chan string, 1), make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				var line struct {
					Msg  string `json:"msg"`
					GRPC string `json:"grpc"`
					Path string `json:"path"`
				}
				switch {
				case json.Unmarshal(sc.Bytes(), &line) != nil:
				case line.Msg == "listening":
					addr <- line.GRPC
				case strings.HasPrefix(line.Msg, "embedded store: state kept"):
					kept <- line.Path
				}
			}
		}()
		select {
		case p := <-kept:
			if p != path {
				t.Fatalf("start-up log: state kept in %q, want %q", p, path)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the service did not say where it keeps state")
		}
		select {
		case a := <-addr:
			conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			return rlpb.NewRateLimitServiceClient(conn), cmd
		case <-time.After(30 * time.Second):
			t.Fatal("the service did not say where it listens")
		}
		return nil, nil
	}
	c, cmd := start()
	for range 4 {
		chargeUser(t, c, "alice", 100_000)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v, want exit 0", err)
	}
	c, cmd = start()
	if got := chargeUser(t, c, "alice", 100_000); got != 500_000 {
		t.Fatalf("after SIGTERM and restart, one more charge: %d remaining, want 500,000 (nothing lost)", got)
	}
	for range 4 {
		chargeUser(t, c, "alice", 100_000)
	}
	// Wait for a snapshot begun after the last charge was answered: it
	// holds the 900,000 (checked on the file, not assumed from the clock).
	charged := time.Now()
	deadline := charged.Add(3 * interval)
	for {
		time.Sleep(interval / 20) // poll interval
		if fi, err := os.Stat(path); err == nil && fi.ModTime().After(charged.Add(10*time.Millisecond)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no snapshot written after the charges")
		}
	}
	// These land after the last snapshot at most one interval before the kill.
	const late = 3
	for range late {
		chargeUser(t, c, "alice", 1)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("service did not die by SIGKILL: %v", err)
	}
	c, _ = start()
	got := chargeUser(t, c, "alice", 1)
	// Remaining after this hit: 1,000,000 - 900,000 - (0..late) - 1.
	if got > 99_999 || got < 99_999-late {
		t.Fatalf("after SIGKILL and restart: %d remaining, want between %d and 99,999 (the 900,000 survive; at most the last interval's %d hits lost)", got, 99_999-late, late)
	}
	t.Logf("after SIGKILL: %d remaining: %d of the %d hits of the last interval were lost", got, got-(99_999-late), late)
}

// withoutEnv drops the named variables from env (KEY=value entries).
func withoutEnv(env []string, names ...string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, n := range names {
			drop = drop || k == n
		}
		if !drop {
			out = append(out, kv)
		}
	}
	return out
}

// TestSnapshotClaimed: two services never keep their state in one snapshot
// (each would overwrite the other's budgets): the second start names the
// file and fails.
func TestSnapshotClaimed(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, "d.yaml", snapConfig)
	path := filepath.Join(t.TempDir(), "snap")
	runInProcess(t, dir, map[string]string{"MEMORY_SNAPSHOT_PATH": path})
	env := map[string]string{"PORT": "0", "GRPC_PORT": "0", "DEBUG_PORT": "0", "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1", "MEMORY_SNAPSHOT_PATH": path}
	err := Run(context.Background(), []string{"--config-dir", dir}, func(k string) string { return env[k] }, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second service on one snapshot: err = %v, want an error naming %s as in use", err, path)
	}
}

// TestSnapshotOtherPortWarns: the default snapshot is named by the gRPC
// port, so a service restarted with another port starts from zero under a
// new file. That is said at start, naming the snapshots beside it, instead
// of every budget being reset silently; a first start in an empty directory
// says nothing of the kind.
func TestSnapshotOtherPortWarns(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, "d.yaml", snapConfig)
	state := t.TempDir()
	start := func() string {
		t.Helper()
		logs := &syncbuf.Buffer{}
		env := map[string]string{"PORT": "0", "GRPC_PORT": "0", "DEBUG_PORT": "0", "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1", "XDG_STATE_HOME": state}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- Run(ctx, []string{"--config-dir", dir}, func(k string) string { return env[k] }, logs, func(*server.Server) { cancel() })
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("run: %v\n%s", err, logs)
			}
		case <-time.After(20 * time.Second):
			cancel()
			t.Fatalf("service did not start\n%s", logs)
		}
		return logs.String()
	}
	if logs := start(); strings.Contains(logs, "holds others") {
		t.Fatalf("first start in an empty directory warned:\n%s", logs)
	}
	// The same service, earlier, on port 8081: its snapshot is beside.
	old := filepath.Join(state, "budgetgen", "ratelimit-memory-8081.snapshot")
	if err := os.Rename(filepath.Join(state, "budgetgen", "ratelimit-memory-0.snapshot"), old); err != nil {
		t.Fatal(err)
	}
	logs := start()
	if !strings.Contains(logs, "holds others") || !strings.Contains(logs, old) {
		t.Fatalf("start beside another port's snapshot: no warning naming %s:\n%s", old, logs)
	}
	if logs := start(); strings.Contains(logs, "holds others") {
		t.Fatalf("a start that found its own snapshot warned:\n%s", logs)
	}
}

// TestSnapshotVolumeFullStillStarts: a restart on a full state volume (the
// snapshot restores, but the start-up write finds no space) serves the
// restored counts and says why it cannot write, instead of refusing to
// start: a refusal leaves every budget unenforced (Envoy fails open) until
// someone frees space. The binary runs in a user and mount namespace
// (unshare) on a tmpfs of one page, which the snapshot fills.
func TestSnapshotVolumeFullStillStarts(t *testing.T) {
	if err := exec.Command("unshare", "--user", "--map-root-user", "--mount", "true").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: this test needs user and mount namespaces (unshare: %v)", err)
		}
		t.Skipf("no unprivileged user and mount namespaces here (unshare: %v)", err)
	}
	dir := t.TempDir()
	writeConfig(t, dir, "d.yaml", snapConfig)
	saved := filepath.Join(t.TempDir(), "ratelimit-memory-0.snapshot")
	c, stop := runInProcess(t, dir, map[string]string{"MEMORY_SNAPSHOT_PATH": saved})
	for range 9 {
		chargeUser(t, c, "alice", 100_000)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "ratelimit")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/budgetgen/budgetgen/cmd/ratelimit").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	state := t.TempDir()
	cmd := exec.Command("unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
		`mount -t tmpfs -o size=4k tmpfs "$XDG_STATE_HOME" && mkdir -m 700 "$XDG_STATE_HOME/budgetgen" && cp "$SAVED" "$XDG_STATE_HOME/budgetgen/" && exec "$BIN" --config-dir "$DIR"`)
	cmd.Env = append(withoutEnv(os.Environ(), "MEMORY_SNAPSHOT_PATH", "MEMORY_SNAPSHOT_INTERVAL", "REDIS_URL"), "PORT=0", "GRPC_PORT=0", "DEBUG_PORT=0", "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"LOG_FORMAT=json", "SHUTDOWN_DELAY=0s", "XDG_STATE_HOME="+state, "SAVED="+saved, "BIN="+bin, "DIR="+dir)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	logs, addr := &syncbuf.Buffer{}, make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.Write(append(sc.Bytes(), '\n'))
			var line struct {
				Msg  string `json:"msg"`
				GRPC string `json:"grpc"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addr <- line.GRPC
			}
		}
		close(addr)
	}()
	var a string
	select {
	case a = <-addr:
	case <-time.After(30 * time.Second):
	}
	if a == "" {
		t.Fatalf("the service did not start on a full state volume:\n%s", logs)
	}
	conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := chargeUser(t, rlpb.NewRateLimitServiceClient(conn), "alice", 1); got != 99_999 {
		t.Fatalf("on a full volume: %d remaining, want 99,999 (the restored 900,000 and this hit)", got)
	}
	if !strings.Contains(logs.String(), "no space left") {
		t.Fatalf("no word of the full volume at start:\n%s", logs)
	}
}
