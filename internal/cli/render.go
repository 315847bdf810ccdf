package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/internal/ctxio"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// defaultSpecFile is read when render gets no SPEC argument; init writes it.
const defaultSpecFile = "budgets.yaml"

// renderOptions is the parsed command line of `budgetgen render`.
type renderOptions struct {
	specPath string // "-" reads stdin
	outDir   string // "" writes a YAML stream to stdout
	rlsDir   string // --ratelimit-config: "" writes no rate limit service config
	mapPath  string // --budget-map: "" writes no budget map
	check    bool   // --check: compare with the files on disk, write nothing
}

func renderOptionsFromArgs(args []string, outDir string) (renderOptions, error) {
	o := renderOptions{specPath: defaultSpecFile, outDir: outDir}
	if len(args) == 1 {
		o.specPath = args[0]
	}
	if o.specPath == "" {
		return o, usageError("render: SPEC must not be empty")
	}
	if o.outDir == "-" {
		return o, usageError("render: -o takes a directory; omit it to write to stdout")
	}
	return o, nil
}

func newRenderCmd(e *env) *cobra.Command {
	var outDir, rlsDir, mapPath string
	var check bool
	cmd := &cobra.Command{
		Use:   "render [SPEC|-]",
		Short: "Render a BudgetSet spec into Envoy Gateway policies",
		Long: `render turns a BudgetSet spec (default ` + defaultSpecFile + `, "-" for stdin) into one
BackendTrafficPolicy per target Gateway holding every budget as a global rate
limit rule, plus a ClientTrafficPolicy per Gateway that strips client-sent
identity headers. Output is a YAML stream on stdout, or with -o one file per
object and a kustomization.yaml, written atomically: on any error nothing is
written; then render prints what it wrote (per Gateway its objects, rules and
budgets). agentgateway budgets bind only with their caps in the rate limit
service (--ratelimit-config) and, shared with another Gateway, the budget map
(--budget-map): render warns when one is missing.

With --check nothing is written: render prints a diff of every file it would
create, change or remove and fails if there is one (a CI or pre-commit drift
check that, unlike git diff, also sees files render would add).

Exit status: 0 rendered (with --check: every file is up to date); 1 invalid
spec, over an Envoy Gateway limit (file:line: field: message on stderr), or
with --check a file differs; 2 bad command line or unreadable spec; 130
stopped by a signal (nothing written).`,
		Example: `  # Print the policies for the example spec
  budgetgen render examples/budgets.yaml

  # Write one file per object plus kustomization.yaml (GitOps)
  budgetgen render examples/budgets.yaml -o examples/rendered

  # Fail when the committed files are not what render writes (CI, pre-commit)
  budgetgen render examples/budgets.yaml -o examples/rendered --check

  # Read the spec from stdin
  cat budgets.yaml | budgetgen render - | kubectl apply --dry-run=server -f -`,
		Args: cobra.MaximumNArgs(1),
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return []string{"yaml", "yml"}, cobra.ShellCompDirectiveFilterFileExt
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := renderOptionsFromArgs(args, outDir)
			if err != nil {
				return err
			}
			o.rlsDir = rlsDir
			o.mapPath = mapPath
			o.check = check
			if check && outDir == "" && rlsDir == "" && mapPath == "" {
				return usageError("render: --check compares files on disk: give -o, --ratelimit-config or --budget-map")
			}
			return runRender(cmd.Context(), e, o)
		},
	}
	cmd.Flags().StringVarP(&outDir, "output-dir", "o", "", "write one file per object and a kustomization.yaml into `DIR` instead of stdout")
	_ = cmd.MarkFlagDirname("output-dir")
	addRateLimitConfigFlag(cmd, &rlsDir)
	addBudgetMapFlag(cmd, &mapPath)
	addCheckFlag(cmd, &check)
	return cmd
}

func runRender(ctx context.Context, e *env, o renderOptions) error {
	bs, err := loadSpecFile(ctx, o.specPath, e.stdin)
	if err != nil {
		return specError(err)
	}
	warnShadowWithoutSince(e, bs)
	// Everything is rendered in memory before a byte is written.
	r, err := renderAll(ctx, bs, o)
	if err != nil {
		return err
	}
	res, rlsFiles, mapFile := r.res, r.rlsFiles, r.mapFile
	noteCostEntries(e, res)
	warnAgentgatewayBinding(e.stderr, bs, o)
	warnBudgetMapSize(e, o.mapPath, mapFile)
	if o.check {
		return checkRender(e.stdout, renderOutputs(o, res, rlsFiles, mapFile))
	}
	// Every output (-o, --ratelimit-config, --budget-map) is staged, every
	// byte in temporary files next to its target, before any is put in
	// place: a failed write of one leaves none written.
	rls, err := stageRateLimitConfig(o.rlsDir, rlsFiles)
	if err != nil {
		return err
	}
	bm, err := stageBudgetMap(o.mapPath, mapFile)
	if err != nil {
		rls.Abort()
		return err
	}
	abort := func() { rls.Abort(); bm.Abort() }
	var out *atomicfile.Staged
	if o.outDir != "" {
		if info, err := os.Stat(o.outDir); err == nil && !info.IsDir() {
			abort()
			return usageError("render: -o %s: not a directory", o.outDir)
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			abort()
			return failure(fmt.Errorf("render: -o %s: %w", o.outDir, err))
		}
		out, err = atomicfile.StageDir(o.outDir, res.Files(), manifestOptions(o))
		if err != nil {
			abort()
			return failure(err)
		}
	} else if _, err := e.stdout.Write(res.YAML()); err != nil {
		abort()
		return failure(fmt.Errorf("write stdout: %w", err))
	}
	if ctx.Err() != nil {
		// Stopped while staging: the staged files are removed, none is
		// put in place.
		out.Abort()
		abort()
		return context.Cause(ctx)
	}
	if err := out.Commit(); err != nil {
		abort()
		return failure(err)
	}
	if err := commitRateLimitConfig(rls); err != nil {
		bm.Abort()
		return err
	}
	// The budget map is put in place last: a service that reads it finds
	// the rules it names already rendered.
	if err := bm.Commit(); err != nil {
		return failure(err)
	}
	if o.outDir == "" {
		return nil // stdout holds the YAML stream
	}
	if err := writeRenderSummary(e.stdout, bs, res, o, rlsFiles); err != nil {
		return failure(fmt.Errorf("render: written, but: %w", err))
	}
	return nil
}

// rendered is everything render writes, computed before the first write.
type rendered struct {
	res      *render.Result
	rlsFiles map[string][]byte // --ratelimit-config
	mapFile  []byte            // --budget-map
}

// renderSpec is render.Render; tests replace it to stop a render midway.
var renderSpec = render.Render

// renderAll renders bs, and the files of --ratelimit-config and --budget-map,
// in memory. A spec of many Gateways and overrides takes seconds to render
// (a minute for tens of thousands of rules): when ctx ends first (Ctrl-C,
// SIGTERM) renderAll returns its cause at once, so nothing is written; the
// abandoned render finishes or dies with the process, which is exiting.
func renderAll(ctx context.Context, bs *spec.BudgetSet, o renderOptions) (*rendered, error) {
	type result struct {
		r   *rendered
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := renderInMemory(bs, o)
		done <- result{r, err}
	}()
	select {
	case res := <-done:
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return res.r, res.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func renderInMemory(bs *spec.BudgetSet, o renderOptions) (*rendered, error) {
	res, err := renderSpec(bs)
	if err != nil {
		return nil, failure(fmt.Errorf("render %s: %w", bs.File(), err))
	}
	rlsFiles, err := rateLimitConfigFiles(res, o.rlsDir) // before any write: nothing is written on error
	if err != nil {
		return nil, failure(err)
	}
	mapFile, err := budgetMapFile(bs, o.mapPath)
	if err != nil {
		return nil, failure(err)
	}
	return &rendered{res: res, rlsFiles: rlsFiles, mapFile: mapFile}, nil
}

// specError is the exit of a spec that could not be loaded: a failure
// (exit 1) for a spec with errors, a usage error (exit 2) for one that
// could not be read.
func specError(err error) error {
	var list yamlpos.List
	if errors.As(err, &list) {
		return failure(err)
	}
	return &ExitError{Code: ExitUsage, Err: err}
}

// loadSpecFile is spec.LoadFile with reads that end when ctx does (a FIFO
// or a pipe that never sends EOF must not make SIGTERM wait).
func loadSpecFile(ctx context.Context, path string, stdin io.Reader) (*spec.BudgetSet, error) {
	name, data, err := path, []byte(nil), error(nil)
	if path == "-" {
		name = "<stdin>"
		data, err = spec.ReadAll(&ctxio.Reader{Ctx: ctx, R: stdin})
	} else {
		data, err = readSpecFile(ctx, path)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read spec %s: %w: give the spec's path, or write a starter spec with budgetgen init", name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("read spec %s: %w", name, err)
	}
	bs, err := spec.Load(data, name)
	if err != nil {
		return nil, err
	}
	// As spec.LoadFile: basePolicy files are relative to the spec.
	dir := "."
	if path != "-" {
		dir = filepath.Dir(path)
	}
	if err := bs.ReadBasePolicies(dir); err != nil {
		return nil, err
	}
	return bs, nil
}

// readSpecFile reads a spec file as ctxio.ReadFile does, but stops after
// spec.MaxFileBytes: a huge file is refused, not read whole into memory.
func readSpecFile(ctx context.Context, path string) ([]byte, error) {
	return ctxio.ReadFileWith(ctx, path, spec.ReadAll)
}

// warnShadowWithoutSince warns about shadow budgets without shadowSince now,
// not a week later: promote refuses a budget whose shadow start is unknown,
// or one whose shadowSince is still ahead (a year typo waits a year).
func warnShadowWithoutSince(e *env, bs *spec.BudgetSet) {
	today := time.Now().UTC().Format(time.DateOnly)
	for _, ref := range bs.Refs() {
		if ref.Rollout == nil || ref.Rollout.Enforced() {
			continue
		}
		if since := ref.Rollout.ShadowSince; since != "" {
			if since > today { // YYYY-MM-DD compares as text
				path := ref.Path + ".shadowSince"
				_, _ = fmt.Fprintf(e.stderr, "budgetgen: warning: %s:%d: %s: budget %s has shadowSince %s, after today (%s UTC); budgetgen promote will refuse it until a week after that day\n", // a warning, not the output
					bs.File(), bs.Line(path), path, ref.Name, since, today)
			}
			continue
		}
		_, _ = fmt.Fprintf(e.stderr, "budgetgen: warning: %s:%d: %s: budget %s is in shadow mode without shadowSince; budgetgen promote will refuse it (add shadowSince: YYYY-MM-DD, the UTC day its shadow measurement started)\n", // a warning, not the output
			bs.File(), bs.Line(ref.Path), ref.Path, ref.Name)
	}
}

// noteCostEntries tells on stderr which Envoy AI Gateway cost entries the
// rendered rules charge (caps past uint32, money): without them in the
// GatewayConfig or the routes, those rules count 0.
func noteCostEntries(e *env, res *render.Result) {
	for _, c := range res.LLMRequestCosts {
		_, _ = fmt.Fprintf(e.stderr, "budgetgen render: note: rules charge %s, which Envoy AI Gateway computes only if the Gateway's GatewayConfig spec.globalLLMRequestCosts (or each AIGatewayRoute's spec.llmRequestCosts) lists {metadataKey: %s, type: %s, cel: ...}; the entry is in annotation %s\n", // a note, not the output
			c.MetadataKey, c.MetadataKey, c.Type, render.AnnotationLLMRequestCosts)
	}
}
