// Command budgetgen renders daily token budgets into Envoy Gateway policies,
// gates committed manifests, reports shadow measurements and promotes budgets.
//
// The main is thin on purpose: everything lives in internal/cli so it can be
// tested without a process boundary.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	_ "time/tzdata" // --time-zone works on images without /usr/share/zoneinfo

	"github.com/budgetgen/budgetgen/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
