package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/internal/ctxio"
	"github.com/budgetgen/budgetgen/internal/promote"
	"github.com/budgetgen/budgetgen/internal/report"
	"github.com/budgetgen/budgetgen/internal/safetext"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// promoteOptions are the flags of promote and demote.
type promoteOptions struct {
	specFile        string
	evidence        string
	maxLimitedShare float64
	force           bool
	reason          string
	now             string // hidden: RFC 3339 time standing in for the clock (tests, dry runs)
}

func (o *promoteOptions) clock() (time.Time, error) {
	if o.now == "" {
		return time.Now().UTC(), nil
	}
	t, err := time.Parse(time.RFC3339, o.now)
	if err != nil {
		return time.Time{}, usageError("--now: want an RFC 3339 time: %v", err)
	}
	return t.UTC(), nil
}

func newPromoteCmd(e *env) *cobra.Command {
	o := &promoteOptions{}
	cmd := &cobra.Command{
		Use:   "promote BUDGET --spec FILE --evidence report.json | --force --reason TEXT",
		Short: "Switch a budget from shadow to enforce in the spec file",
		Long: `promote flips one budget to mode: enforce in the spec file and records the date
(enforcedSince), editing the file in place: comments, order and formatting are kept.

It refuses unless the budget has been in shadow for 7 full UTC days: with
shadowSince D, the days D+1..D+7 must be over, so promotion opens at D+8 00:00 UTC.
It needs --evidence (the JSON of budgetgen report): the report must cover those
days, end at most 7 days before today, carry the spec's shadowSince, and show a
share of principal-days over the cap under --max-limited-share.
Without --evidence no measurements were looked at, and promote refuses unless
--force is given. --force --reason "..." overrides every refusal and records
the reason. A budget already in enforce is left as it is (exit 0).`,
		Example: `  budgetgen report --valkey valkey:6379 --spec budgets.yaml --format json > week.json
  budgetgen promote per-run --spec budgets.yaml --evidence week.json
  budgetgen promote per-run --spec budgets.yaml --force --reason "incident 42: runaway agent"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runRollout(cmd.Context(), e, o, args[0], true)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.specFile, "spec", "", "BudgetSet spec file to edit (required)")
	f.StringVar(&o.evidence, "evidence", "", "JSON report (budgetgen report --format json) to check before promoting (required unless --force)")
	f.Float64Var(&o.maxLimitedShare, "max-limited-share", promote.DefaultMaxLimitedShare, "largest share of principal-days over the cap the evidence may show (strictly under)")
	f.BoolVar(&o.force, "force", false, "promote despite refusals (needs --reason)")
	f.StringVar(&o.reason, "reason", "", "why the promotion is forced; recorded as promotionReason")
	f.StringVar(&o.now, "now", "", "RFC 3339 time used as the current time")
	_ = f.MarkHidden("now")
	return cmd
}

// loadSpecBytes loads a spec file's bytes as render loads the file: base
// policies are read relative to its directory.
func loadSpecBytes(src []byte, path string) (*spec.BudgetSet, error) {
	bs, err := spec.Load(src, path)
	if err != nil {
		return nil, err
	}
	if err := bs.ReadBasePolicies(filepath.Dir(path)); err != nil {
		return nil, err
	}
	return bs, nil
}

// runRollout is promote (up) or demote (!up): read, edit, validate, write atomically.
func runRollout(ctx context.Context, e *env, o *promoteOptions, budget string, up bool) error {
	if err := o.check(); err != nil {
		return err
	}
	now, err := o.clock()
	if err != nil {
		return err
	}
	// Concurrent promotions of one spec (two CI jobs) are serialised, and
	// the spec is read under the lock, so neither edit is lost.
	unlock, err := atomicfile.Lock(ctx, o.specFile)
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: err}
	}
	defer unlock()
	res, where, err := editSpec(ctx, e, o, budget, up, now)
	if errors.Is(err, promote.ErrNothingToDo) {
		// Already in that mode (a retried job): done, the file untouched.
		if _, werr := fmt.Fprintln(e.stdout, safetext.Inline(err.Error())); werr != nil {
			return failure(werr)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if err := printRollout(e, o.specFile, budget, up, res, where); err != nil {
		// The spec is written; only the message was lost.
		return failure(fmt.Errorf("promote: %s written, but: %w", safetext.Inline(o.specFile), err))
	}
	return nil
}

// check refuses flag combinations that cannot be meant.
func (o *promoteOptions) check() error {
	if o.specFile == "" {
		return usageError("--spec FILE is required")
	}
	if o.reason != "" && !o.force {
		return usageError("--reason goes with --force")
	}
	// Written so NaN fails too: every comparison with it is false.
	if !(o.maxLimitedShare > 0 && o.maxLimitedShare <= 1) {
		return usageError("--max-limited-share must be in (0, 1], got %v", o.maxLimitedShare)
	}
	return nil
}

// editSpec reads the spec (the caller holds its lock), promotes or demotes
// the budget and writes the file atomically; on any error nothing is written.
func editSpec(ctx context.Context, e *env, o *promoteOptions, budget string, up bool, now time.Time) (promote.Result, renderedIn, error) {
	src, err := readSpecFile(ctx, o.specFile)
	if err != nil {
		return promote.Result{}, renderedIn{}, &ExitError{Code: ExitUsage, Err: fmt.Errorf("read spec %s: %w", o.specFile, err)}
	}
	// The spec must be valid before the edit too, loaded as render loads it
	// (base policies included): a broken file is not ours to fix.
	bs, err := loadSpecBytes(src, o.specFile)
	if err != nil {
		return promote.Result{}, renderedIn{}, specError(err)
	}
	opts := promote.Options{
		Now: now, File: o.specFile, Force: o.force, Reason: o.reason, MaxLimitedShare: o.maxLimitedShare,
		Validate: func(file string, b []byte) error { _, err := loadSpecBytes(b, file); return err },
	}
	if up && o.evidence != "" {
		ev, err := readEvidence(ctx, o.evidence)
		if err != nil {
			return promote.Result{}, renderedIn{}, &ExitError{Code: ExitUsage, Err: err}
		}
		opts.Evidence = ev
		// An unknown budget is Promote's error, with the known names.
		opts.SpecCaps, _ = report.SpecCaps(bs, budget)
	}
	var out []byte
	var res promote.Result
	if up {
		out, res, err = promote.Promote(src, budget, opts)
	} else {
		out, res, err = promote.Demote(src, budget, opts)
	}
	if err != nil {
		// Refusals, unknown budgets and invalid edits alike: nothing was written.
		return promote.Result{}, renderedIn{}, failure(err)
	}
	// Checked after the shadow days, whose refusal says more.
	if err := requireEvidence(o, budget, up); err != nil {
		return promote.Result{}, renderedIn{}, err
	}
	if err := promote.WriteFileAtomic(o.specFile, out); err != nil {
		return promote.Result{}, renderedIn{}, failure(err)
	}
	if up && o.evidence == "" {
		// Forced (requireEvidence let it through): said once it is written.
		_, _ = fmt.Fprintf(e.stderr, "budgetgen promote: warning: no measurements were looked at (no --evidence): %s is promoted on --force alone\n", safetext.Inline(budget)) // a note; the promotion is done
	}
	return res, budgetRenderedIn(bs, budget), nil
}

// renderedIn says where a budget's mode renders: Envoy Gateway rules carry
// shadowMode; on agentgateway it is shadow_mode in the rate limit config of
// its domain, written by render --ratelimit-config (docs/agentgateway.md).
type renderedIn struct{ envoy, agentgateway bool }

func budgetRenderedIn(bs *spec.BudgetSet, budget string) renderedIn {
	var r renderedIn // the frontier cap: Envoy Gateway only
	for i := range bs.Spec.Budgets {
		if bs.Spec.Budgets[i].Name != budget {
			continue
		}
		for _, g := range bs.BudgetGateways(&bs.Spec.Budgets[i]) {
			r.agentgateway = r.agentgateway || g.IsAgentgateway()
			r.envoy = r.envoy || !g.IsAgentgateway()
		}
	}
	return r
}

// printRollout says what was written, any notes, and that a render applies it.
func printRollout(e *env, specFile, budget string, up bool, res promote.Result, where renderedIn) error {
	var err error
	switch {
	case !up:
		_, err = fmt.Fprintf(e.stdout, "%s: %s demoted to shadow on %s (shadow clock restarted)\n", safetext.Inline(specFile), safetext.Inline(budget), res.Date)
	case res.Forced && len(res.Overridden) > 0:
		_, err = fmt.Fprintf(e.stdout, "%s: %s promoted to enforce on %s, forced: %q (overrode: %v)\n", safetext.Inline(specFile), safetext.Inline(budget), res.Date, res.Reason, res.Overridden)
	default:
		_, err = fmt.Fprintf(e.stdout, "%s: %s promoted to enforce on %s after %d full days in shadow\n", safetext.Inline(specFile), safetext.Inline(budget), res.Date, res.FullDays)
	}
	for _, n := range res.Notes {
		if err == nil {
			_, err = fmt.Fprintf(e.stdout, "note: %s\n", safetext.Inline(n))
		}
	}
	if err == nil && (where.envoy || !where.agentgateway) {
		_, err = fmt.Fprintf(e.stdout, "render again to apply: the budget's rules now render shadowMode: %v\n", !up)
	}
	if err == nil && where.agentgateway {
		line := "render again with --ratelimit-config DIR and give the rate limit service its files to apply on agentgateway: the budget's descriptors now render without shadow_mode\n"
		if !up {
			line = "render again with --ratelimit-config DIR and give the rate limit service its files to apply on agentgateway: the budget's descriptors now render shadow_mode: true\n"
		}
		_, err = fmt.Fprint(e.stdout, line)
	}
	return err
}

// requireEvidence refuses a promotion that looked at no measurements: without
// --evidence nothing shows the budget's cap would have been right during its
// shadow week, so only --force (with its recorded --reason) may enforce it,
// and then a note says so once the spec is written.
func requireEvidence(o *promoteOptions, budget string, up bool) error {
	if !up || o.evidence != "" {
		return nil
	}
	if !o.force {
		return failure(fmt.Errorf("promote %s: refused: no measurements were looked at (no --evidence); give the shadow week's report (budgetgen report --spec %s --format json > week.json, then --evidence week.json), or promote without it with --force --reason \"...\"",
			safetext.Inline(budget), safetext.Inline(o.specFile)))
	}
	return nil
}

// maxEvidenceBytes bounds what promote reads of --evidence: a report's JSON
// lists per budget its caps and top principals, far under this; a larger
// file is the wrong one, and is not read whole into memory.
const maxEvidenceBytes = 64 << 20

func readEvidence(ctx context.Context, path string) (*report.Report, error) {
	b, err := ctxio.ReadFileWith(ctx, path, func(r io.Reader) ([]byte, error) {
		return io.ReadAll(io.LimitReader(r, maxEvidenceBytes+1))
	})
	if err != nil {
		return nil, fmt.Errorf("read evidence: %w", err)
	}
	if len(b) > maxEvidenceBytes {
		return nil, fmt.Errorf("read evidence: %s: file too large (over %d MiB): is it the report's JSON (budgetgen report --format json)?", path, maxEvidenceBytes>>20)
	}
	var r report.Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("evidence %s: not a budgetgen report JSON: %w", path, err)
	}
	return &r, nil
}
