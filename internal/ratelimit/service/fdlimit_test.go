package service

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
)

// helperEnv makes the test binary run the service instead of the tests
// (TestMain), so a test can start it under prlimit.
const helperEnv = "BUDGETGEN_TEST_RUN_SERVICE"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(runHelperService())
	}
	os.Exit(m.Run())
}

// runHelperService runs the service from the environment and prints its
// gRPC address on stdout once it listens.
func runHelperService() int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }() // the test closing stdin stops it
	err := Run(ctx, []string{"--config-dir", os.Getenv("HELPER_CONFIG_DIR")}, os.Getenv, os.Stderr, func(s *server.Server) {
		g, _, _, _ := s.Addrs()
		fmt.Println("grpc", g.String())
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper service:", err)
		return 1
	}
	return 0
}

// TestManyIdleConnectionsUnderFDLimit: under `prlimit --nofile=256`, 300
// idle HTTP/2 connections exhaust the service's file descriptors; accept
// fails with EMFILE, the service backs off and keeps accepting (it used to
// exit), the idle timeout frees descriptors, and calls are answered.
func TestManyIdleConnectionsUnderFDLimit(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("prlimit (util-linux) is required under CI=true: hack/install-deps.sh installs it")
		}
		t.Skip("prlimit (util-linux) not installed")
	}
	dir := t.TempDir()
	writeConfig(t, dir, "a.yaml", "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1000}\n")
	logPath := filepath.Join(t.TempDir(), "service.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, prlimit, "--nofile=256:256", os.Args[0])
	transport := suiteTransport
	if transport == "" {
		transport = server.TransportLean
	}
	cmd.Env = append(os.Environ(), helperEnv+"=1", "HELPER_CONFIG_DIR="+dir,
		"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
		"LOG_LEVEL=warn", "GRPC_IDLE_TIMEOUT=3s", "GRPC_SERVER_IMPL="+transport, "XDG_STATE_HOME="+t.TempDir(),
		"SHUTDOWN_DELAY=0s") // not the pod default when the suite itself runs in one
	cmd.Stderr = logFile
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
	}()
	var addr string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "grpc "); ok {
			addr = a
			break
		}
	}
	if addr == "" {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("service did not start:\n%s", b)
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	// 300 idle HTTP/2 connections: preface and SETTINGS, then nothing.
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for i := 0; i < 300; i++ {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		_, _ = io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
		idle = append(idle, c)
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlpb.NewRateLimitServiceClient(conn)
	req := &rlpb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "a"}}}}}
	var lastErr error
	answered := false
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !answered; {
		select {
		case err := <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("the service exited under fd exhaustion: %v\n%s", err, b)
		default:
		}
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := client.ShouldRateLimit(cctx, req, grpc.WaitForReady(true))
		ccancel()
		answered = err == nil && resp.OverallCode == rlpb.RateLimitResponse_OK
		lastErr = err
	}
	b, _ := os.ReadFile(logPath)
	if !answered {
		t.Fatalf("no answer under fd exhaustion: %v\n%s", lastErr, b)
	}
	if !strings.Contains(string(b), "too many open files") {
		t.Errorf("the service never ran out of descriptors, so the test proved nothing:\n%s", b)
	}
	select {
	case err := <-exited:
		t.Fatalf("the service exited: %v", err)
	default:
	}
}
