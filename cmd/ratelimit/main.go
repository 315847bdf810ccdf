// Command ratelimit is budgetgen's Envoy rate limit service, a drop-in for
// envoyproxy/ratelimit: same settings (environment or flags), ports, config
// format and answers. Without REDIS_URL it uses an embedded memory store.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	_ "time/tzdata" // RESET_TIME_ZONE works on images without /usr/share/zoneinfo

	"github.com/budgetgen/budgetgen/internal/buildinfo"
	"github.com/budgetgen/budgetgen/internal/ratelimit/service"
)

func main() {
	os.Exit(run())
}

func run() int {
	ctx, skipDelay, stop := stopSignals()
	defer stop()
	for _, a := range os.Args[1:] {
		if a == "--version" || a == "-version" {
			fmt.Print(buildinfo.Read().String("ratelimit"))
			return 0
		}
	}
	err := service.RunWith(ctx, service.Options{Args: os.Args[1:], Getenv: os.Getenv, Log: os.Stderr, SkipDelay: skipDelay})
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp): // --help printed the usage
		return 0
	case errors.Is(err, service.ErrUsage):
		fmt.Fprintln(os.Stderr, "ratelimit:", err)
		return 2
	default:
		fmt.Fprintln(os.Stderr, "ratelimit:", err)
		return 1
	}
}

// stopSignals: the first SIGTERM or SIGINT cancels ctx (the service fails
// readiness and serves on for SHUTDOWN_DELAY, then drains); the second
// closes skipDelay (the rest of the delay is skipped: someone wants it
// gone now). Later ones are ignored, as before; stop unregisters.
func stopSignals() (ctx context.Context, skipDelay <-chan struct{}, stop func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	skip, done := make(chan struct{}), make(chan struct{})
	go func() {
		for _, next := range []func(){cancel, func() { close(skip) }} {
			select {
			case <-sigs:
				next()
			case <-done:
				return
			}
		}
	}()
	return ctx, skip, func() { signal.Stop(sigs); close(done); cancel() }
}
