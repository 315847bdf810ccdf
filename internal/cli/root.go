// Package cli holds the budgetgen command tree. One file per subcommand, each a
// newXCmd(*env) constructor; flags parse into plain option structs.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/ctxio"
	"github.com/budgetgen/budgetgen/internal/safetext"
)

// env is what every subcommand may use instead of process globals, so tests can
// run commands in-process with their own streams and clock.
type env struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// Run executes budgetgen with args and returns the process exit status.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// Every read of stdin gives up when ctx ends (SIGTERM, SIGINT in main):
	// a CI runner's stop must not wait for an EOF that never comes.
	if stdin != nil {
		stdin = &ctxio.Reader{Ctx: ctx, R: stdin}
	}
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr}
	root := newRootCmd(e)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	if ctx.Err() != nil && errors.Is(err, context.Cause(ctx)) {
		// Stopped by a signal while waiting for input or a lock: nothing
		// was written (every write is staged and renamed).
		_, _ = fmt.Fprintf(stderr, "budgetgen: stopped: %s\n", safetext.Lines(err.Error())) // the exit code carries the outcome
		return ExitInterrupted
	}
	var ee *ExitError
	if !errors.As(err, &ee) {
		// Errors that reach here without a code come from cobra itself:
		// unknown flags, wrong argument counts, unknown subcommands.
		if isCobraUsage(err) {
			ee = &ExitError{Code: ExitUsage, Err: withHelpHint(cmd, err)}
		} else {
			ee = &ExitError{Code: ExitFailure, Err: err}
		}
	}
	if !ee.Silent && ee.Err != nil {
		// File names and values in errors come from input: escaped, so no
		// line of stderr can pass for a CI workflow command.
		_, _ = fmt.Fprintf(stderr, "budgetgen: %s\n", safetext.Lines(ee.Err.Error())) // the exit code carries the outcome
	}
	return ee.Code
}

func newRootCmd(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "budgetgen",
		Short: "Daily token budgets for LLM traffic through Envoy Gateway",
		Long: `budgetgen turns a BudgetSet spec into Envoy Gateway BackendTrafficPolicy rules
that cap each principal's daily LLM tokens, checks committed manifests against the
budget invariants, reports shadow measurements, and promotes budgets to enforce.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &ExitError{Code: ExitUsage, Err: withHelpHint(cmd, err)}
	})
	for _, add := range subcommands {
		root.AddCommand(add(e))
	}
	return root
}

// subcommands lists the constructors of budgetgen's subcommands; each file adds
// its own in an init-free way by appearing here.
var subcommands = []func(*env) *cobra.Command{
	newVersionCmd,
	newPromoteCmd,
	newDemoteCmd,
	newReportCmd,
	newLedgerCmd,
	newExportCmd,
	newAssertCmd,
	newRenderCmd,
	newInitCmd,
}

// withHelpHint adds to one of cobra's own usage errors ("unknown flag",
// "accepts 1 arg(s)") where to read the command's usage; cmd is the
// command that refused the command line.
func withHelpHint(cmd *cobra.Command, err error) error {
	if cmd == nil {
		return err
	}
	msg, sep := strings.TrimRight(err.Error(), "\n"), " "
	if strings.Contains(msg, "\n") {
		sep = "\n" // after cobra's "Did you mean this?" list
	}
	return fmt.Errorf("%s%s(see %s --help)", msg, sep, cmd.CommandPath())
}

// isCobraUsage reports whether err is one of cobra's argument or command errors.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires at least", "requires at most", "invalid argument", "flag needs an argument", "required flag"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// Command is budgetgen's command tree, for tests outside this package that
// check what the docs say against it (docs/docs_test.go); its commands are
// not meant to be run.
func Command() *cobra.Command { return newRootCmd(&env{}) }
