package cli

import (
	"context"
	"fmt"

	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/safetext"
	"github.com/budgetgen/budgetgen/pkg/assert"
	"github.com/budgetgen/budgetgen/pkg/assert/crd"
	"github.com/budgetgen/budgetgen/pkg/assert/output"
	"github.com/budgetgen/budgetgen/pkg/manifest"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// assertOptions is the parsed command line of budgetgen assert.
type assertOptions struct {
	Paths               []string
	Output              string
	FailOn              string
	Skip                []string
	Spec                string
	AllowEnforce        []string
	EnvoyGatewayVersion string
	MaxFileSize         int64
	AllowEmpty          bool
	// Summary prints only the summary (per-rule counts); Quiet only the
	// findings. Text and github formats.
	Summary, Quiet bool

	failOn assert.Severity // set by validate
}

// validate checks the flags once, before any input is read; every error is
// CLI misuse (exit 2).
func (o *assertOptions) validate() error {
	if len(o.Paths) == 0 {
		return usageError("assert: no input: give files or directories to check, or - for stdin")
	}
	if slices.Contains(o.Paths, manifest.Stdin) && o.Spec == manifest.Stdin {
		return usageError("assert: stdin cannot be both input and --spec")
	}
	if !slices.Contains(output.Formats(), strings.ToLower(o.Output)) {
		return usageError("assert: unknown output format %q (want one of %s)", o.Output, strings.Join(output.Formats(), ", "))
	}
	sev, err := assert.ParseSeverity(o.FailOn)
	if err != nil {
		return usageError("assert: --fail-on: %v", err)
	}
	o.failOn = sev
	var skip []string
	for _, s := range o.Skip {
		for _, id := range strings.Split(s, ",") {
			id = strings.ToUpper(strings.TrimSpace(id))
			if id == "" {
				continue
			}
			if assert.Lookup(id) == nil {
				return usageError("assert: --skip %s: unknown rule ID (known: %s)", id, strings.Join(assert.IDs(), ", "))
			}
			skip = append(skip, id)
		}
	}
	slices.Sort(skip)
	o.Skip = slices.Compact(skip)
	if o.Summary && o.Quiet {
		return usageError("assert: --summary and --quiet: give one (summary only, or findings only)")
	}
	if f := strings.ToLower(o.Output); (o.Summary || o.Quiet) && f != output.Text && f != output.GitHub {
		return usageError("assert: --summary and --quiet apply to the text and github formats, not %s (machine formats always carry everything)", o.Output)
	}
	if o.EnvoyGatewayVersion != "" {
		if _, err := assert.ParseVersion(o.EnvoyGatewayVersion); err != nil {
			return usageError("assert: --envoy-gateway-version: %v", err)
		}
	}
	if o.MaxFileSize <= 0 {
		return usageError("assert: --max-file-size must be positive")
	}
	return nil
}

func (o *assertOptions) skips(id string) bool { return slices.Contains(o.Skip, id) }

func newAssertCmd(e *env) *cobra.Command {
	o := &assertOptions{}
	cmd := &cobra.Command{
		Use:   "assert [flags] PATH... | -",
		Short: "Fail the build when committed budget manifests break the budget invariants",
		Long: `assert is the render gate: it reads Kubernetes manifests (files, directories
recursively for .yaml/.yml/.json, or - for stdin; kustomize or helm output
included) and checks every BackendTrafficPolicy that holds token budgets:
shared counters, shadow mode until promoted, token cost from response
metadata, daily units, one policy per Gateway, identity headers set from a
verified credential and stripped from client requests, Envoy Gateway's
schema and CEL rules, drift from render (with --spec), overrides that bind,
version hazards, Envoy Gateway's size limits, Envoy AI Gateway writing the
charged token key for every AIGatewayRoute, credentials that cannot be
skipped, and budgets covering every route of their Gateway. Rules: ` + strings.Join(assert.IDs(), ", ") + ` (docs/assert.md).

Exit status: 0 clean, 1 when a finding is at or above --fail-on or the input
holds no budget policy (unless --allow-empty), 2 when the input or the
command line cannot be used, 130 when stopped by a signal.`,
		Example: `  # The gate in CI, annotating the pull request
  budgetgen assert --spec budgets/budgets.yaml -o github deploy/

  # Check what kustomize will apply
  kustomize build deploy/ | budgetgen assert -

  # Without a spec, name the budgets promoted to enforce; skip the schema check
  budgetgen assert --allow-enforce per-api-key --skip BG007 rendered/ gateway/`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Paths = args
			if err := o.validate(); err != nil {
				return err
			}
			return runAssert(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.Output, "output", "o", output.Text, "output format: "+strings.Join(output.Formats(), ", "))
	f.StringVar(&o.FailOn, "fail-on", "error", "lowest severity that fails the gate: error or warning")
	f.StringSliceVar(&o.Skip, "skip", nil, "rule IDs not to run (repeatable or comma-separated)")
	f.StringVar(&o.Spec, "spec", "", "BudgetSet spec: budget modes for BG002, token metadata for BG003, drift check BG008")
	f.StringSliceVar(&o.AllowEnforce, "allow-enforce", nil, "without --spec: budgets (annotation name) or rules (<ns>/<policy>/rule/<i>) allowed to enforce")
	f.StringVar(&o.EnvoyGatewayVersion, "envoy-gateway-version", "", "Envoy Gateway version the manifests are applied to, e.g. v1.8.1 (enables BG010)")
	f.BoolVar(&o.AllowEmpty, "allow-empty", false, "pass when the input holds no budget policy (by default that fails: a wrong path or a build that dropped them checks nothing)")
	f.BoolVar(&o.Summary, "summary", false, "text/github: print only the summary with per-rule counts, not each finding")
	f.BoolVarP(&o.Quiet, "quiet", "q", false, "text/github: print only the findings (nothing when clean), no summary")
	f.Int64Var(&o.MaxFileSize, "max-file-size", manifest.DefaultMaxFileBytes, "largest input file or stdin stream read, in bytes")
	return cmd
}

// inputError is input that cannot be read: exit 2 with the reason.
func inputError(err error) error {
	return &ExitError{Code: ExitUsage, Err: err}
}

func runAssert(ctx context.Context, e *env, o *assertOptions) error {
	objs, err := manifest.ReadPaths(ctx, o.Paths, e.stdin, manifest.Options{MaxFileBytes: o.MaxFileSize,
		// A GitOps tree holds CI configs and Helm values next to manifests.
		SkipForeign: func(file string) {
			if o.Quiet {
				return
			}
			_, _ = fmt.Fprintf(e.stderr, "assert: skipped %s: no Kubernetes object in it (no apiVersion and kind)\n", safetext.Inline(file)) // a warning; the result goes to stdout
		}})
	if err != nil {
		return inputError(fmt.Errorf("read input: %w", err))
	}
	opts := assert.Options{Skip: o.Skip, AllowEnforce: o.AllowEnforce, EnvoyGatewayVersion: o.EnvoyGatewayVersion}
	if o.Spec != "" {
		bs, err := loadSpecFile(ctx, o.Spec, e.stdin)
		if err != nil {
			return inputError(fmt.Errorf("load spec: %w", err))
		}
		opts.Spec = specFacts(o.Spec, bs)
		if !o.skips("BG008") {
			if opts.Rendered, err = renderForDrift(bs); err != nil {
				return inputError(fmt.Errorf("render spec %s for the drift check: %w", o.Spec, err))
			}
		}
	}
	if !o.skips("BG007") {
		v, err := crd.Validator()
		if err != nil {
			return inputError(err)
		}
		opts.Validator = v
	}
	rep, err := assert.Run(ctx, objs, opts)
	if err != nil {
		return inputError(err)
	}
	w, err := output.New(o.Output, e.stdout, output.Meta{
		Rules: rep.Rules, Objects: rep.Objects, Files: rep.Files, ToolVersion: version(),
		Skipped: o.Skip, Summary: o.Summary, Quiet: o.Quiet,
		NoBudgetPolicy: rep.BudgetPolicies == 0 && !o.AllowEmpty,
	})
	if err != nil {
		return usageError("assert: %v", err)
	}
	if err := output.WriteAll(w, rep.Findings); err != nil {
		return fmt.Errorf("write findings: %w", err)
	}
	if rep.BudgetPolicies == 0 && !o.AllowEmpty {
		// Fail closed: an empty directory, a wrong path or a kustomize build
		// that dropped the policies would otherwise pass with nothing checked.
		return &ExitError{Code: ExitFailure, Err: fmt.Errorf("assert: no budget policy in the input (%d objects from %d files): no BackendTrafficPolicy has token rules or the %s annotation and no AgentgatewayPolicy has a global rate limit; check the paths (or the build that produced them), or pass --allow-empty if the input is meant to hold none", rep.Objects, len(rep.Files), assert.RuleBudgetsAnnotation)}
	}
	if rep.Failed(o.failOn) {
		return &ExitError{Code: ExitFailure, Err: fmt.Errorf("assert: %d findings at or above %s", countAtLeast(rep, o.failOn), o.failOn), Silent: true}
	}
	return nil
}

func countAtLeast(rep *assert.Report, s assert.Severity) int {
	n := 0
	for _, f := range rep.Findings {
		if f.Severity >= s {
			n++
		}
	}
	return n
}

// specFacts extracts what the gate needs from a loaded spec.
func specFacts(path string, bs *spec.BudgetSet) *assert.SpecFacts {
	f := &assert.SpecFacts{
		File:           path,
		Enforced:       map[string]bool{},
		Budgets:        map[string]bool{},
		TokenNamespace: bs.Spec.TokenSource.Namespace,
		TokenKey:       bs.Spec.TokenSource.Key,
	}
	for _, r := range bs.Refs() {
		f.Budgets[r.Name] = true
		if r.Rollout != nil && r.Rollout.Mode == spec.ModeEnforce {
			f.Enforced[r.Name] = true
		}
	}
	return f
}
