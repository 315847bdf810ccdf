package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// startValkey runs a private valkey-server on a free loopback port.
func startValkey(ctx context.Context, dir string) (string, int, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", 0, nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close() // only used to pick a free port
	cmd := exec.CommandContext(ctx, "valkey-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return "", 0, nil, fmt.Errorf("start valkey-server (install it, see notes/valkey.md): %w", err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	stop := func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }
	if err := valkeytest.WaitReady(addr, 5*time.Second); err != nil {
		stop()
		return "", 0, nil, err
	}
	return addr, cmd.Process.Pid, stop, nil
}
