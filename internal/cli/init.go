package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/internal/safetext"
	"github.com/budgetgen/budgetgen/pkg/spec"
	"github.com/budgetgen/budgetgen/templates"
)

// initOptions is the parsed command line of `budgetgen init`.
type initOptions struct {
	template   string
	output     string // "-" writes to stdout
	gatewayDir string // --gateway-dir; "" = "gateway" next to output
	noGateway  bool   // --no-gateway: write the spec only
	force      bool
	now        string // hidden: RFC 3339 clock for tests
}

// gatewayFile is where init writes the template's platform objects; "" when
// it writes none (--no-gateway, or the spec goes to stdout without
// --gateway-dir).
func (o initOptions) gatewayFile() string {
	switch {
	case o.noGateway:
		return ""
	case o.gatewayDir != "":
		return filepath.Join(o.gatewayDir, "gateway.yaml")
	case o.output == "-":
		return ""
	}
	return filepath.Join(filepath.Dir(o.output), "gateway", "gateway.yaml")
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

Next to it, in gateway/gateway.yaml (--gateway-dir), init writes the platform
objects the template's budgets are checked against: a Gateway, an Envoy AI
Gateway route writing the token count, and the SecurityPolicies that set the
identity headers. Replace them with your own, and keep them in the gate's
input: budgetgen render budgets.yaml -o manifests/ then
budgetgen assert manifests/ gateway/ --spec budgets.yaml passes as written.
It refuses to overwrite an existing file unless --force is given, and writes
both files or neither.

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
	cmd.Flags().StringVar(&o.gatewayDir, "gateway-dir", "", "write the template's Gateway, route and SecurityPolicies to `DIR`/gateway.yaml (default: gateway/ next to the spec; none when the spec goes to stdout)")
	cmd.Flags().BoolVar(&o.noGateway, "no-gateway", false, "write the spec only")
	cmd.Flags().BoolVar(&o.force, "force", false, "overwrite the files if they exist")
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
	gwFile := o.gatewayFile()
	if o.output == "-" {
		if _, err := e.stdout.Write(data); err != nil {
			return err
		}
		return writeGatewayFile(e, o, gwFile)
	}
	if gwFile != "" && !o.force {
		if _, err := os.Lstat(gwFile); err == nil {
			return failure(fmt.Errorf("init: %s already exists (use --force to overwrite)", gwFile))
		}
	}
	// With --force an existing spec is overwritten: keep it, so a failed
	// gateway file can put it back (both files or neither).
	previous, readErr := os.ReadFile(o.output)
	existed := readErr == nil
	// -o platform/budgets.yaml (the example of --help) in a fresh
	// repository: create the directory, as for gateway/ and render -o.
	if err := os.MkdirAll(filepath.Dir(o.output), 0o755); err != nil {
		return failure(fmt.Errorf("init: %w", err))
	}
	err = atomicfile.WriteFile(o.output, data, atomicfile.Options{NoOverwrite: !o.force})
	if errors.Is(err, fs.ErrExist) {
		return failure(fmt.Errorf("init: %s already exists (use --force to overwrite)", o.output))
	}
	if err != nil {
		return failure(fmt.Errorf("init: %w", err))
	}
	if err := writeGatewayFile(e, o, gwFile); err != nil {
		// Both files or neither; the error says why.
		if existed {
			if rerr := atomicfile.WriteFile(o.output, previous, atomicfile.Options{}); rerr != nil {
				return failure(fmt.Errorf("%w; and %s could not be put back: %w", err, safetext.Inline(o.output), rerr))
			}
		} else {
			_ = os.Remove(o.output) // we created it
		}
		return err
	}
	next := ""
	if gwFile != "" {
		next = " && budgetgen assert manifests/ " + safetext.Inline(filepath.Dir(gwFile)) + "/ --spec " + safetext.Inline(o.output)
	}
	_, _ = fmt.Fprintf(e.stderr, "wrote %s (template %s); next: budgetgen render %s -o manifests/%s\n", safetext.Inline(o.output), safetext.Inline(o.template), safetext.Inline(o.output), next) // a note: the files are written
	return nil
}

// writeGatewayFile writes the template's platform objects to path (nothing
// when path is ""), creating its directory.
func writeGatewayFile(e *env, o initOptions, path string) error {
	if path == "" {
		return nil
	}
	data, err := templates.Gateway(o.template)
	if err != nil {
		return failure(fmt.Errorf("init: %w", err))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return failure(fmt.Errorf("init: %w", err))
	}
	err = atomicfile.WriteFile(path, data, atomicfile.Options{NoOverwrite: !o.force})
	if errors.Is(err, fs.ErrExist) {
		return failure(fmt.Errorf("init: %s already exists (use --force to overwrite)", path))
	}
	if err != nil {
		return failure(fmt.Errorf("init: %w", err))
	}
	_, _ = fmt.Fprintf(e.stderr, "wrote %s: the Gateway, AI Gateway route and SecurityPolicies the starter's budgets are checked against; replace them with yours\n", safetext.Inline(path)) // a note
	return nil
}
