// Command ratelimit is budgetgen's Envoy rate limit service, a drop-in for
// envoyproxy/ratelimit: same settings (environment or flags), ports, config
// format and answers. Without REDIS_URL it uses an embedded memory store.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	_ "time/tzdata" // RESET_TIME_ZONE works on images without /usr/share/zoneinfo

	"github.com/budgetgen/budgetgen/internal/ratelimit/service"
)

func main() {
	os.Exit(run())
}

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err := service.Run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, service.ErrUsage):
		fmt.Fprintln(os.Stderr, "ratelimit:", err)
		return 2
	default:
		fmt.Fprintln(os.Stderr, "ratelimit:", err)
		return 1
	}
}
