package cli

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestFlagValueNames: --help names each flag's value by the back-quoted word
// of its usage (pflag.UnquoteUsage), so a quoted phrase such as a command
// line would print as "--postgres budgetgen ledger sync". Every value name is
// one word.
func TestFlagValueNames(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			name, _ := pflag.UnquoteUsage(f)
			if strings.ContainsAny(name, " \t") {
				t.Errorf("%s --%s: value name %q in --help is not one word (only the value's name may be back-quoted in a flag's usage)", c.CommandPath(), f.Name, name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd(&env{}))
}

// TestUsageErrorsPointAtHelp: a misspelt subcommand, an unknown flag or a
// wrong argument count exits 2 and says where the command's usage is; a
// group command (ledger) refuses an unknown subcommand instead of printing
// its help and exiting 0.
func TestUsageErrorsPointAtHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ledger", "snyc"}, `unknown command "snyc" for "budgetgen ledger" (see budgetgen ledger --help)`},
		{[]string{"render", "--outdir", "x"}, "unknown flag: --outdir (see budgetgen render --help)"},
		{[]string{"render", "a.yaml", "b.yaml"}, "accepts at most 1 arg(s), received 2 (see budgetgen render --help)"},
		{[]string{"promote"}, "(see budgetgen promote --help)"},
		{[]string{"ledger", "sync", "--valkey"}, "flag needs an argument: --valkey (see budgetgen ledger sync --help)"},
		{[]string{"rendr"}, "Did you mean this?\n\trender\n(see budgetgen --help)"},
	} {
		code, stdout, stderr := runCLI(t, tc.args...)
		if code != ExitUsage || stdout != "" || !strings.Contains(stderr, tc.want) {
			t.Errorf("budgetgen %s: exit %d, stdout %q, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), code, stdout, stderr, ExitUsage, tc.want)
		}
	}
	// With no subcommand a group command still prints its help.
	if code, stdout, _ := runCLI(t, "ledger"); code != ExitOK || !strings.Contains(stdout, "Available Commands") {
		t.Errorf("budgetgen ledger: exit %d, stdout %q; want its help and exit 0", code, stdout)
	}
}
