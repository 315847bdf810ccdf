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
