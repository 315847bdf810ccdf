package cli

import (
	"github.com/spf13/cobra"
)

func newDemoteCmd(e *env) *cobra.Command {
	o := &promoteOptions{maxLimitedShare: 1}
	cmd := &cobra.Command{
		Use:   "demote BUDGET --spec FILE",
		Short: "Switch a budget back to shadow in the spec file, at once",
		Long: `demote puts one budget back in mode: shadow with shadowSince today, with no
checks: it is the way back when enforcement hurts. The 7-day shadow clock of a
later promote starts again. The spec file is edited in place. A budget already
in shadow is left as it is (exit 0).`,
		Example: `  budgetgen demote per-run --spec budgets.yaml`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runRollout(cmd.Context(), e, o, args[0], false)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.specFile, "spec", "", "BudgetSet spec file to edit (required)")
	f.StringVar(&o.now, "now", "", "RFC 3339 time used as the current time")
	_ = f.MarkHidden("now")
	return cmd
}
