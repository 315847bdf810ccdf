package cli

import (
	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/buildinfo"
)

// version is the build's version (internal/buildinfo: -ldflags, else the
// module version stamped from the VCS tag; never "(devel)").
func version() string { return buildinfo.Read().Version }

func newVersionCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print budgetgen's version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := e.stdout.Write([]byte(buildinfo.Read().String("budgetgen")))
			return err
		},
	}
}
