package cli

import (
	"errors"
	"fmt"
)

// Exit codes shared by every subcommand, in the style of conftest and kubeconform.
const (
	// ExitOK means the command did what it was asked and found nothing wrong.
	ExitOK = 0
	// ExitFailure means the input was read but is wrong: an invalid spec, a failed
	// assertion, a refused promotion.
	ExitFailure = 1
	// ExitUsage means the command line itself is wrong, or input could not be read.
	ExitUsage = 2
	// ExitInterrupted means a signal (SIGTERM, SIGINT) stopped the command
	// before it wrote anything (128 + SIGINT, as shells report it).
	ExitInterrupted = 130
)

// ExitError carries an exit code from deep in a command to the one place that
// exits. Err is printed unless Silent is set (for example when findings were
// already written as the command's output).
type ExitError struct {
	Code   int
	Err    error
	Silent bool
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// usageError marks an error as CLI misuse (exit 2).
func usageError(format string, args ...any) error {
	return &ExitError{Code: ExitUsage, Err: fmt.Errorf(format, args...)}
}

// failure marks an error as a failed check on readable input (exit 1).
func failure(err error) error {
	return &ExitError{Code: ExitFailure, Err: err}
}

// exitCode maps an error returned by a command to the process exit status.
// Errors that are not ExitError are failures on the input (exit 1); cobra's own
// flag and argument errors are turned into usage errors in Run.
func exitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return ExitFailure
}
