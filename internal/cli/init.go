package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/internal/safetext"
	"github.com/budgetgen/budgetgen/pkg/spec"
	"github.com/budgetgen/budgetgen/templates"
)

// initOptions is the parsed command line of `budgetgen init`.
type initOptions struct {
	template string
	output   string // "-" writes to stdout
	force    bool
	now      string // hidden: RFC 3339 clock for tests
}

func (o initOptions) validate() error {
	if o.output == "" {
		return usageError("init: -o must not be empty")
	}
	if _, err := templates.Get(o.template); err != nil {
		return usageError("init: %v", err)
	}
	return nil
}

func newInitCmd(e *env) *cobra.Command {
	o := initOptions{}
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Write a starter BudgetSet spec",
		Long: `init writes a commented starter BudgetSet spec from a built-in template.
Every shadow-mode budget gets shadowSince: today (UTC), the day its shadow
measurement starts, so promote can count the 7 full days after it.
It refuses to overwrite an existing file unless --force is given.

Templates: ` + fmt.Sprint(templates.Names()) + `.`,
		Example: `  # Write budgets.yaml from the minimal template
  budgetgen init

  # Every kind of budget, to a chosen file
  budgetgen init --template ai-gateway -o platform/budgets.yaml

  # Print a template
  budgetgen init --template ai-gateway -o -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			return runInit(e, o)
		},
	}
	cmd.Flags().StringVarP(&o.template, "template", "t", templates.Default, "starter template `NAME`")
	cmd.Flags().StringVarP(&o.output, "output", "o", defaultSpecFile, "write the spec to `FILE` (\"-\" for stdout)")
	cmd.Flags().BoolVar(&o.force, "force", false, "overwrite FILE if it exists")
	cmd.Flags().StringVar(&o.now, "now", "", "RFC 3339 time used as the current time")
	_ = cmd.Flags().MarkHidden("now")
	_ = cmd.RegisterFlagCompletionFunc("template", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return templates.Names(), cobra.ShellCompDirectiveNoFileComp
	})
	return cmd
}

func runInit(e *env, o initOptions) error {
	data, err := templates.Get(o.template)
	if err != nil {
		return usageError("init: %v", err)
	}
	now := time.Now()
	if o.now != "" {
		if now, err = time.Parse(time.RFC3339, o.now); err != nil {
			return usageError("init: --now: %v", err)
		}
	}
	if data, err = templates.WithShadowSince(data, now.UTC().Format(spec.DateLayout)); err != nil {
		return failure(fmt.Errorf("init: %w", err))
	}
	if o.output == "-" {
		_, err := e.stdout.Write(data)
		return err
	}
	err = atomicfile.WriteFile(o.output, data, atomicfile.Options{NoOverwrite: !o.force})
	if errors.Is(err, fs.ErrExist) {
		return failure(fmt.Errorf("init: %s already exists (use --force to overwrite)", o.output))
	}
	if err != nil {
		return failure(fmt.Errorf("init: %w", err))
	}
	_, _ = fmt.Fprintf(e.stderr, "wrote %s (template %s); render it with: budgetgen render %s\n", safetext.Inline(o.output), safetext.Inline(o.template), safetext.Inline(o.output)) // a note: the file is written
	return nil
}
