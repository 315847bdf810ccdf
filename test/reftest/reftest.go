// Package reftest builds and runs the reference service, envoyproxy/ratelimit,
// from its Go module, for differential tests and the load harness.
package reftest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// Module and Version pin the reference build (the commit the notes describe).
const (
	Module  = "github.com/envoyproxy/ratelimit/src/service_cmd"
	Version = "v1.4.1-0.20260122083618-3fb702589d36"
)

var buildMu sync.Mutex

// CacheDir is where the binary is installed: $BUDGETGEN_PEER_DIR, or
// <user cache dir>/budgetgen-peer/<version>.
func CacheDir() (string, error) {
	if d := os.Getenv("BUDGETGEN_PEER_DIR"); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("user cache dir: %w", err)
	}
	return filepath.Join(base, "budgetgen-peer", Version), nil
}

// Binary returns the reference binary's path, building it with
// `GOBIN=<CacheDir> go install Module@Version` when it is not there yet
// (about 35 s cold, a few seconds with a warm module and build cache).
func Binary(ctx context.Context) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "service_cmd")
	if st, err := os.Stat(bin); err == nil && st.Mode().IsRegular() {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "install", Module+"@"+Version)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build reference %s@%s: %w\n%s", Module, Version, err, out)
	}
	return bin, nil
}

// Options for Start.
type Options struct {
	// Binary is the reference binary. Required.
	Binary string
	// RedisAddr is the Valkey host:port. Required.
	RedisAddr string
	// RuntimeRoot holds <RuntimeRoot>/ratelimit/config/*.yaml. Required.
	RuntimeRoot string
	// Env adds or overrides environment variables (e.g. CACHE_KEY_PREFIX).
	Env []string
	// LogPath receives stdout and stderr; empty discards them.
	LogPath string
}

// Process is a running reference service.
type Process struct {
	Cmd      *exec.Cmd
	GRPCAddr string
	HTTPAddr string
	done     chan struct{}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }() // only used to pick a free port
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start runs the reference on free loopback ports and waits until its HTTP
// /healthcheck answers 200.
func Start(ctx context.Context, o Options) (*Process, error) {
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	cmd := exec.Command(o.Binary)
	cmd.Env = append(os.Environ(),
		"USE_STATSD=false", "LOG_LEVEL=warn", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=single", "REDIS_URL="+o.RedisAddr,
		"RUNTIME_ROOT="+o.RuntimeRoot, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"HOST=127.0.0.1", "PORT="+strconv.Itoa(ports[0]), "GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(ports[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(ports[2]),
	)
	cmd.Env = append(cmd.Env, o.Env...)
	if o.LogPath != "" {
		f, err := os.Create(o.LogPath)
		if err != nil {
			return nil, err
		}
		defer func() { _ = f.Close() }() // the child holds its own descriptor of the log
		cmd.Stdout, cmd.Stderr = f, f
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start reference: %w", err)
	}
	p := &Process{Cmd: cmd, HTTPAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		GRPCAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-p.done:
			return nil, errors.New("reference exited during start-up (see its log)")
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		default:
		}
		resp, err := http.Get("http://" + p.HTTPAddr + "/healthcheck")
		if err == nil {
			_ = resp.Body.Close() // health probe: only the status matters
			if resp.StatusCode == 200 {
				if c, err := net.DialTimeout("tcp", p.GRPCAddr, time.Second); err == nil {
					_ = c.Close() // readiness probe only
					return p, nil
				}
			}
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, errors.New("reference did not become healthy within 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Stop kills the process and waits for it.
func (p *Process) Stop() {
	if p.Cmd.Process != nil {
		_ = p.Cmd.Process.Kill()
	}
	<-p.done
}
