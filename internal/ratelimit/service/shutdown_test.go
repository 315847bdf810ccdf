package service

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
	"github.com/budgetgen/budgetgen/internal/syncbuf"
)

// stoppable is a service run whose stop the test drives: cancel begins it
// (as the first SIGTERM does), closing skip ends SHUTDOWN_DELAY (as the
// second does), done receives RunWith's error.
type stoppable struct {
	grpcAddr, healthURL string
	cancel              context.CancelFunc
	skip                chan struct{}
	done                chan error
	logs                *syncbuf.Buffer
	// stopped: the test has received from done.
	stopped bool
}

// wait returns RunWith's error, or fails the test when it has not
// returned within 20s.
func (st *stoppable) wait(t *testing.T, what string) error {
	t.Helper()
	select {
	case err := <-st.done:
		st.stopped = true
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("%s\n%s", what, st.logs)
	}
	return nil
}

func startStoppable(t *testing.T, delay string) *stoppable {
	t.Helper()
	dir := t.TempDir()
	writeConfig(t, dir, "d.yaml", snapConfig)
	env := map[string]string{"PORT": "0", "GRPC_PORT": "0", "DEBUG_PORT": "0", "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1",
		"MEMORY_SNAPSHOT_PATH": "off", "SHUTDOWN_DELAY": delay}
	ctx, cancel := context.WithCancel(context.Background())
	st := &stoppable{cancel: cancel, skip: make(chan struct{}), done: make(chan error, 1), logs: &syncbuf.Buffer{}}
	ready := make(chan *server.Server, 1)
	go func() {
		st.done <- RunWith(ctx, Options{Args: []string{"--config-dir", dir}, Getenv: func(k string) string { return env[k] }, Log: st.logs,
			Ready: func(s *server.Server) { ready <- s }, SkipDelay: st.skip})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-st.skip:
		default:
			close(st.skip)
		}
		if !st.stopped {
			<-st.done
		}
	})
	select {
	case srv := <-ready:
		g, h, _, _ := srv.Addrs()
		st.grpcAddr, st.healthURL = g.String(), "http://"+h.String()+"/healthcheck"
	case err := <-st.done:
		st.stopped = true
		t.Fatalf("service exited: %v\n%s", err, st.logs)
	case <-time.After(20 * time.Second):
		t.Fatalf("service did not start\n%s", st.logs)
	}
	return st
}

// healthStatus is /healthcheck's status code, or 0 when the HTTP port does
// not answer.
func healthStatus(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// freshClient dials a new connection (not one opened before the stop).
func freshClient(t *testing.T, addr string) rlpb.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlpb.NewRateLimitServiceClient(conn)
}

func assertRefused(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("%s accepts a connection after the stop", addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s after the stop: %v, want connection refused", addr, err)
	}
}

// TestShutdownDelayServesNewConnections: after the stop begins, readiness
// fails at once but the gRPC port still accepts and answers a caller that
// connects only now (an Envoy or agentgateway that has not yet seen the
// pod leave the endpoints); the second signal ends the delay, and then the
// port refuses connections. Without the delay the listeners closed at the
// signal and that caller failed (and, failing open, went uncounted).
func TestShutdownDelayServesNewConnections(t *testing.T) {
	st := startStoppable(t, "1m")
	if code := healthStatus(st.healthURL); code != http.StatusOK {
		t.Fatalf("healthcheck before the stop: %d", code)
	}
	st.cancel()
	waitFor(t, "readiness to fail while the HTTP port still answers", func() bool { return healthStatus(st.healthURL) == http.StatusInternalServerError })
	if got := chargeUser(t, freshClient(t, st.grpcAddr), "alice", 7); got != 1_000_000-7 {
		t.Fatalf("a call on a connection made during the delay: remaining %d, want %d", got, 1_000_000-7)
	}
	select {
	case err := <-st.done:
		st.stopped = true
		t.Fatalf("the service stopped during the delay: %v", err)
	default:
	}
	t0 := time.Now()
	close(st.skip)
	if err := st.wait(t, "the second signal did not end the 1m delay"); err != nil {
		t.Fatalf("run: %v", err)
	}
	t.Logf("stopped %v after the skip", time.Since(t0).Round(time.Millisecond))
	assertRefused(t, st.grpcAddr)
	if !strings.Contains(st.logs.String(), "shutdown delay skipped") {
		t.Errorf("no log of the skipped delay:\n%s", st.logs)
	}
}

// TestShutdownDelayEnds: with no second signal the service serves for the
// whole delay, then closes its listeners by itself and stops.
func TestShutdownDelayEnds(t *testing.T) {
	const delay = 400 * time.Millisecond
	st := startStoppable(t, delay.String())
	t0 := time.Now()
	st.cancel()
	if err := st.wait(t, "the service did not stop after its delay"); err != nil {
		t.Fatalf("run: %v", err)
	}
	if took := time.Since(t0); took < delay {
		t.Fatalf("stopped %v after the signal, before the %v delay", took, delay)
	}
	assertRefused(t, st.grpcAddr)
	if !strings.Contains(st.logs.String(), "shutdown delay over") {
		t.Errorf("no log of the delay's end:\n%s", st.logs)
	}
}

// TestSecondSignalSkipsShutdownDelay: the real binary (cmd/ratelimit's
// signal handling) with SHUTDOWN_DELAY=1m. The first SIGTERM fails
// readiness and a caller connecting afterwards is still served; the second
// SIGTERM skips the rest of the delay and the process exits 0 well before
// the minute is up.
func TestSecondSignalSkipsShutdownDelay(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ratelimit")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/budgetgen/budgetgen/cmd/ratelimit").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	writeConfig(t, dir, "d.yaml", snapConfig)
	cmd := exec.Command(bin, "--config-dir", dir)
	cmd.Env = append(withoutEnv(os.Environ(), "REDIS_URL"), "PORT=0", "GRPC_PORT=0", "DEBUG_PORT=0", "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		"LOG_FORMAT=json", "MEMORY_SNAPSHOT_PATH=off", "SHUTDOWN_DELAY=1m")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	type addrs struct{ GRPC, HTTP string }
	listening := make(chan addrs, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct {
				Msg string `json:"msg"`
				addrs
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				listening <- line.addrs
			}
		}
	}()
	var a addrs
	select {
	case a = <-listening:
	case <-time.After(30 * time.Second):
		t.Fatal("the service did not say where it listens")
	}
	health := "http://" + a.HTTP + "/healthcheck"
	if code := healthStatus(health); code != http.StatusOK {
		t.Fatalf("healthcheck before SIGTERM: %d", code)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "readiness to fail after SIGTERM while the HTTP port still answers", func() bool { return healthStatus(health) == http.StatusInternalServerError })
	if got := chargeUser(t, freshClient(t, a.GRPC), "bob", 3); got != 1_000_000-3 {
		t.Fatalf("a call on a connection made after SIGTERM: remaining %d", got)
	}
	t0 := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after the second SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second SIGTERM did not skip the 1m delay")
	}
	t.Logf("exited %v after the second SIGTERM", time.Since(t0).Round(time.Millisecond))
}
