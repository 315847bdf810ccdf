// Package promote flips a budget of a BudgetSet spec between shadow and
// enforce by editing the spec file in place: comments, order and formatting
// are kept and only the mode and date fields change, so the GitOps diff is as
// small as the decision.
//
// The shadow rule: a budget whose shadowSince is day D may be promoted once
// the 7 full UTC days D+1 .. D+7 have completed, that is from D+8 00:00 UTC.
// Day D itself never counts: shadowing started at some time during it.
package promote

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/internal/report"
)

// Defaults.
const (
	// DefaultMaxLimitedShare is the largest share of principal-days over the
	// cap that evidence may show for promotion (strictly under it).
	DefaultMaxLimitedShare = 0.01
	// RequiredFullDays is how many full UTC days a budget must have spent in
	// shadow before promotion.
	RequiredFullDays = 7
)

// Mode values in the spec.
const (
	ModeShadow  = "shadow"
	ModeEnforce = "enforce"
)

// Spec field names edited here.
const (
	fieldMode            = "mode"
	fieldShadowSince     = "shadowSince"
	fieldEnforcedSince   = "enforcedSince"
	fieldPromotionReason = "promotionReason"
	fieldTokensPerDay    = "tokensPerDay"
)

// Options for Promote. The zero value promotes with the shadow rule, no
// evidence and the default share.
type Options struct {
	// Now is the clock; required (the caller injects time.Now in production).
	Now time.Time
	// Evidence is a parsed `budgetgen report --format json`; nil skips the
	// evidence checks.
	Evidence *report.Report
	// MaxLimitedShare bounds the evidence's share of principal-days over the
	// cap; 0 means DefaultMaxLimitedShare.
	MaxLimitedShare float64
	// Force overrides every refusal; Reason is then required and recorded in
	// the spec as promotionReason.
	Force  bool
	Reason string
	// File names the spec in messages.
	File string
	// Validate, when set, checks the edited document before it is returned
	// (budgetgen passes the spec loader); an error aborts the edit.
	Validate func(file string, src []byte) error
}

// Result describes a done promotion or demotion.
type Result struct {
	Budget string
	From   string // previous mode
	To     string
	Date   string // recorded UTC day
	// FullDays is the number of full UTC days spent in shadow at Now.
	FullDays int
	Forced   bool
	Reason   string
	// Overridden lists the refusals --force overrode.
	Overridden []string
	// ChangedLines is the size of the line diff of the spec file.
	ChangedLines int
}

// RefusedError lists why a promotion was refused. Nothing was written.
type RefusedError struct {
	Budget  string
	Reasons []string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("promotion of %s refused: %s (use --force --reason \"...\" to override)", e.Budget, strings.Join(e.Reasons, "; "))
}

// ErrUnknownBudget is wrapped when the spec has no budget of that name.
var ErrUnknownBudget = errors.New("unknown budget")

// FullShadowDays returns the number of full UTC days completed since the
// shadowing day (exclusive) at now, and the earliest time promotion is allowed.
func FullShadowDays(shadowSince, now time.Time) (int, time.Time) {
	d := utcDay(shadowSince)
	earliest := d.AddDate(0, 0, RequiredFullDays+1)
	full := int(utcDay(now).Sub(d).Hours()/24) - 1
	return max(full, 0), earliest
}

func utcDay(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

// ParseDay accepts a date (2006-01-02) or an RFC 3339 time and returns its UTC day.
func ParseDay(s string) (time.Time, error) {
	if t, err := time.Parse(report.DateLayout, s); err == nil {
		return t, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("not a date (YYYY-MM-DD): %q", s)
	}
	return utcDay(t), nil
}

// Promote returns src with budget switched to enforce, or a *RefusedError.
func Promote(src []byte, budget string, o Options) ([]byte, Result, error) {
	if o.Now.IsZero() {
		return nil, Result{}, errors.New("promote: no clock")
	}
	if o.Force && strings.TrimSpace(o.Reason) == "" {
		return nil, Result{}, errors.New("--force needs --reason \"why\": the reason is recorded in the spec")
	}
	b, s, err := locate(src, budget, o.File)
	if err != nil {
		return nil, Result{}, err
	}
	mode, _ := b.scalar(fieldMode)
	if mode == "" {
		mode = ModeShadow
	}
	res := Result{Budget: budget, From: mode, To: ModeEnforce, Date: utcDay(o.Now).Format(report.DateLayout), Forced: o.Force}
	if mode == ModeEnforce {
		since, _ := b.scalar(fieldEnforcedSince)
		return nil, res, fmt.Errorf("%s: budget %s is already in enforce (since %s); nothing to do", o.File, budget, orUnknown(since))
	}
	if mode != ModeShadow {
		return nil, res, fmt.Errorf("%s: budget %s: unknown mode %q", o.File, budget, mode)
	}
	reasons := refusals(b, budget, o, &res)
	if len(reasons) > 0 && !o.Force {
		return nil, res, &RefusedError{Budget: budget, Reasons: reasons}
	}
	res.Overridden = reasons
	ops := []fieldOp{
		{key: fieldMode, value: ModeEnforce},
		{key: fieldEnforcedSince, value: res.Date},
	}
	if o.Force {
		res.Reason = o.Reason
		ops = append(ops, fieldOp{key: fieldPromotionReason, value: strconv.Quote(o.Reason)})
	} else {
		ops = append(ops, fieldOp{key: fieldPromotionReason, remove: true})
	}
	out, err := rewrite(s, b, budget, o, ops, map[string]string{fieldMode: ModeEnforce, fieldEnforcedSince: res.Date})
	if err != nil {
		return nil, res, err
	}
	res.ChangedLines = changedLines(src, out)
	return out, res, nil
}

// Demote returns src with budget back in shadow from today: no checks. The
// shadow clock restarts, so a later promotion waits 7 full days again.
func Demote(src []byte, budget string, o Options) ([]byte, Result, error) {
	if o.Now.IsZero() {
		return nil, Result{}, errors.New("demote: no clock")
	}
	b, s, err := locate(src, budget, o.File)
	if err != nil {
		return nil, Result{}, err
	}
	mode, _ := b.scalar(fieldMode)
	if mode == "" {
		mode = ModeShadow
	}
	res := Result{Budget: budget, From: mode, To: ModeShadow, Date: utcDay(o.Now).Format(report.DateLayout)}
	if mode == ModeShadow {
		since, _ := b.scalar(fieldShadowSince)
		return nil, res, fmt.Errorf("%s: budget %s is already in shadow (since %s); nothing to do", o.File, budget, orUnknown(since))
	}
	ops := []fieldOp{
		{key: fieldMode, value: ModeShadow},
		{key: fieldShadowSince, value: res.Date},
		{key: fieldEnforcedSince, remove: true},
		{key: fieldPromotionReason, remove: true},
	}
	out, err := rewrite(s, b, budget, o, ops, map[string]string{fieldMode: ModeShadow, fieldShadowSince: res.Date})
	if err != nil {
		return nil, res, err
	}
	res.ChangedLines = changedLines(src, out)
	return out, res, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "an unrecorded date"
	}
	return s
}

func locate(src []byte, budget, file string) (*budgetNode, *source, error) {
	all, err := findBudgets(file, src)
	if err != nil {
		return nil, nil, err
	}
	names := make([]string, 0, len(all))
	for _, b := range all {
		if b.name == budget {
			return b, newSource(src), nil
		}
		names = append(names, b.name)
	}
	sort.Strings(names)
	return nil, nil, fmt.Errorf("%s: %w %q (budgets: %s)", file, ErrUnknownBudget, budget, strings.Join(names, ", "))
}

// rewrite applies ops, then re-reads the result to prove the edit did what it
// meant and nothing else broke.
func rewrite(s *source, b *budgetNode, budget string, o Options, ops []fieldOp, want map[string]string) ([]byte, error) {
	edits, err := planEdits(s, b, ops, []string{fieldMode, fieldShadowSince, "name"})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.File, err)
	}
	out := apply(s.src, edits)
	after, _, err := locate(out, budget, o.File)
	if err != nil {
		return nil, fmt.Errorf("%s: edited spec does not parse (nothing written): %w", o.File, err)
	}
	for k, v := range want {
		if got, _ := after.scalar(k); got != v {
			return nil, fmt.Errorf("%s: edit of %s.%s did not take (got %q); nothing written", o.File, budget, k, got)
		}
	}
	if o.Validate != nil {
		if err := o.Validate(o.File, out); err != nil {
			return nil, fmt.Errorf("edited spec is invalid (nothing written): %w", err)
		}
	}
	return out, nil
}

// refusals applies the shadow rule and, with evidence, the evidence rules.
func refusals(b *budgetNode, budget string, o Options, res *Result) []string {
	var reasons []string
	since, ok := b.scalar(fieldShadowSince)
	if !ok || since == "" {
		return append(reasons, "no shadowSince recorded, so 7 full UTC days in shadow cannot be shown")
	}
	d, err := ParseDay(since)
	if err != nil {
		return append(reasons, fmt.Sprintf("shadowSince: %v", err))
	}
	full, earliest := FullShadowDays(d, o.Now)
	res.FullDays = full
	if o.Now.Before(earliest) {
		reasons = append(reasons, fmt.Sprintf("in shadow since %s: %d of %d full UTC days completed; earliest promotion %s",
			since, full, RequiredFullDays, earliest.Format(time.RFC3339)))
	}
	if o.Evidence != nil {
		capText, _ := b.scalar(fieldTokensPerDay)
		reasons = append(reasons, evidenceRefusals(o.Evidence, budget, d, capText, o)...)
	}
	return reasons
}

func evidenceRefusals(ev *report.Report, budget string, shadowDay time.Time, capText string, o Options) []string {
	if ev.Version != report.FormatVersion {
		return []string{fmt.Sprintf("evidence is %q, want %q (regenerate it with budgetgen report --format json)", ev.Version, report.FormatVersion)}
	}
	var eb *report.Budget
	for i := range ev.Budgets {
		if ev.Budgets[i].Name == budget {
			eb = &ev.Budgets[i]
		}
	}
	if eb == nil {
		return []string{fmt.Sprintf("evidence has no budget %s", budget)}
	}
	var reasons []string
	// The days that count: full shadow days, none after yesterday.
	first := shadowDay.AddDate(0, 0, 1)
	last := utcDay(o.Now).AddDate(0, 0, -1)
	var covered, principalDays, over int
	seen := map[string]bool{}
	for _, d := range eb.PerDay {
		day, err := time.Parse(report.DateLayout, d.Date)
		// Today's partial day (--include-today) is never a full shadow day.
		if err != nil || d.Partial || day.Before(first) || day.After(last) {
			continue
		}
		if seen[d.Date] {
			// A report lists each day once; a repeated day (an edited
			// file) must not stretch the coverage.
			reasons = append(reasons, fmt.Sprintf("evidence lists day %s twice", d.Date))
			continue
		}
		seen[d.Date] = true
		covered++
		principalDays += d.PrincipalDays
		over += d.OverCap
	}
	// Override principals are their own populations in the report, each
	// judged against its own cap; promotion enforces their rules too, so
	// their principal-days count towards the share (on the same days).
	for _, ov := range eb.Overridden {
		for _, d := range ov.PerDay {
			if d.Partial || !seen[d.Date] {
				continue
			}
			principalDays += d.PrincipalDays
			over += d.OverCap
		}
	}
	if covered < RequiredFullDays {
		reasons = append(reasons, fmt.Sprintf("evidence covers %d of the %d full shadow days needed (report window %s..%s, shadow days from %s)",
			covered, RequiredFullDays, ev.From, ev.To, first.Format(report.DateLayout)))
	}
	if principalDays == 0 {
		why := ""
		if eb.NoData != "" {
			why = ": " + eb.NoData
		}
		reasons = append(reasons, "evidence has no measured principal-days for "+budget+why)
	} else {
		maxShare := o.MaxLimitedShare
		if maxShare == 0 {
			maxShare = DefaultMaxLimitedShare
		}
		share := float64(over) / float64(principalDays)
		if share >= maxShare {
			reasons = append(reasons, fmt.Sprintf("evidence shows %d of %d principal-days over the cap (%.2f%%), not under %.2f%%; suggested cap %d",
				over, principalDays, share*100, maxShare*100, eb.SuggestedCap))
		}
	}
	if capText != "" && eb.Cap != 0 {
		if c, err := strconv.ParseUint(capText, 10, 64); err == nil && c != eb.Cap {
			reasons = append(reasons, fmt.Sprintf("evidence was measured against a cap of %d but the spec now says %d; report again", eb.Cap, c))
		}
	}
	return reasons
}

// WriteFileAtomic writes data to path through a temporary file in the same
// directory and a rename (internal/atomicfile), keeping path's permissions and,
// when path is a symbolic link, the link: a failure leaves the old file
// untouched and never a partial one, and the directory is synced.
func WriteFileAtomic(path string, data []byte) error {
	perm := atomicfile.DefaultPerm
	if st, err := os.Stat(path); err == nil {
		perm = st.Mode().Perm()
	}
	return atomicfile.WriteFile(path, data, atomicfile.Options{Perm: perm})
}
