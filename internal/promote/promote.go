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
	// DefaultMaxLimitedShare is the largest share of principal-windows over
	// a cap that evidence may show for promotion (strictly under it).
	DefaultMaxLimitedShare = report.DefaultMaxLimitedShare
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
)

// Options for Promote. The zero value promotes with the shadow rule, no
// evidence and the default share.
type Options struct {
	// Now is the clock; required (the caller injects time.Now in production).
	Now time.Time
	// Evidence is a parsed `budgetgen report --format json`; nil skips the
	// evidence checks.
	Evidence *report.Report
	// SpecCaps are the budget's caps in the spec now (report.SpecCaps):
	// evidence measured against other caps is refused.
	SpecCaps map[string]uint64
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
	// Notes qualify an accepted promotion (a cap judged on a projection).
	Notes []string
}

// RefusedError lists why a promotion was refused. Nothing was written.
type RefusedError struct {
	// File and Line place the budget in the spec: its mode field, or its
	// first field when it has none.
	File    string
	Line    int
	Budget  string
	Reasons []string
}

func (e *RefusedError) Error() string {
	where := ""
	if e.File != "" {
		where = fmt.Sprintf("%s:%d: ", e.File, e.Line)
	}
	return fmt.Sprintf("%spromotion of %s refused: %s (use --force --reason \"...\" to override)", where, e.Budget, strings.Join(e.Reasons, "; "))
}

// ErrUnknownBudget is wrapped when the spec has no budget of that name.
var ErrUnknownBudget = errors.New("unknown budget")

// ErrNothingToDo is wrapped when the budget is already in the mode asked
// for: the run is done, and the spec needs no change.
var ErrNothingToDo = errors.New("nothing to do")

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
		return nil, res, fmt.Errorf("%s: budget %s is already in enforce (since %s); %w", o.File, budget, orUnknown(since), ErrNothingToDo)
	}
	if mode != ModeShadow {
		return nil, res, fmt.Errorf("%s: budget %s: unknown mode %q", o.File, budget, mode)
	}
	reasons := refusals(b, budget, o, &res)
	if len(reasons) > 0 && !o.Force {
		return nil, res, &RefusedError{File: o.File, Line: b.line(fieldMode), Budget: budget, Reasons: reasons}
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
		return nil, res, fmt.Errorf("%s: budget %s is already in shadow (since %s); %w", o.File, budget, orUnknown(since), ErrNothingToDo)
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
		reasons = append(reasons, evidenceScope(o.Evidence, budget, d, o.Now)...)
		reasons = append(reasons, evidenceRefusals(o.Evidence, budget, d, o, res)...)
	}
	return reasons
}

// MaxEvidenceAgeDays is how many days before today the evidence's last day
// may be: older evidence shows a shadow week, but not the traffic the cap
// will meet once enforced.
const MaxEvidenceAgeDays = RequiredFullDays

// evidenceScope refuses evidence from another version of the spec (the
// budget's shadowSince in the report differs from the spec's: it was demoted
// since, or the report read another file) and stale evidence.
func evidenceScope(ev *report.Report, budget string, shadowDay, now time.Time) []string {
	var reasons []string
	for i := range ev.Budgets {
		eb := &ev.Budgets[i]
		if eb.Name != budget || eb.ShadowSince == "" {
			continue
		}
		if d, err := ParseDay(eb.ShadowSince); err != nil || !d.Equal(shadowDay) {
			reasons = append(reasons, fmt.Sprintf("evidence was reported with shadowSince %s but the spec says %s: report again with the current spec",
				eb.ShadowSince, shadowDay.Format(report.DateLayout)))
		}
	}
	last, err := time.Parse(report.DateLayout, ev.To)
	if err != nil {
		return append(reasons, fmt.Sprintf("evidence's last day %q is not a date (YYYY-MM-DD): is it budgetgen report's JSON?", ev.To))
	}
	today := utcDay(now)
	if age := int(today.Sub(last).Hours() / 24); age > MaxEvidenceAgeDays {
		reasons = append(reasons, fmt.Sprintf("evidence is stale: its last day %s is %d days before today (%s); at most %d: report again",
			ev.To, age, today.Format(report.DateLayout), MaxEvidenceAgeDays))
	}
	return reasons
}

// evidenceRefusals judges every cap of the budget in the evidence on its
// own window: a day or hour cap on the full shadow days it covers, a week or
// month cap on a window measured after shadowSince (or a projection from at
// least RequiredFullDays days, noted), each with a share of principal-windows
// over it under the maximum, measured against the cap the spec has now.
func evidenceRefusals(ev *report.Report, budget string, shadowDay time.Time, o Options, res *Result) []string {
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
	seen := map[string]bool{}
	for i := range eb.Caps {
		c := &eb.Caps[i]
		key := c.Window + "/" + c.Measure
		seen[key] = true
		label := c.Measure + " per " + c.Window
		if c.Cap == 0 {
			// Nothing was counted over an unknown cap: its share says nothing.
			reasons = append(reasons, label+": evidence was measured without the cap (cap unknown): report again with --spec")
			continue
		}
		for _, r := range capRefusals(ev, c, shadowDay, o, res) {
			reasons = append(reasons, label+": "+r)
		}
		if want, ok := o.SpecCaps[key]; ok && want != 0 && want != c.Cap {
			reasons = append(reasons, fmt.Sprintf("%s: evidence was measured against a cap of %d but the spec now says %d; report again", label, c.Cap, want))
		}
	}
	for _, key := range sortedKeys(o.SpecCaps) {
		if !seen[key] {
			reasons = append(reasons, fmt.Sprintf("evidence has no %s cap of %s (report again with the current spec)", strings.Replace(key, "/", " ", 1), budget))
		}
	}
	if len(eb.Caps) == 0 {
		reasons = append(reasons, "evidence has no measured cap for "+budget)
	}
	return reasons
}

// capRefusals judges one cap of the evidence.
func capRefusals(ev *report.Report, c *report.Cap, shadowDay time.Time, o Options, res *Result) []string {
	first := shadowDay.AddDate(0, 0, 1)
	last := utcDay(o.Now).AddDate(0, 0, -1)
	var reasons []string
	windows, over := 0, 0
	switch c.Window {
	case "day", "hour":
		cov := coveredDays(c, first, last)
		reasons = append(reasons, cov.reasons...)
		if cov.days < RequiredFullDays {
			reasons = append(reasons, fmt.Sprintf("evidence covers %d of the %d full shadow days needed (report %s..%s, shadow days from %s)",
				cov.days, RequiredFullDays, ev.From, ev.To, first.Format(report.DateLayout)))
		}
		windows, over = cov.windows, cov.over
	default:
		r, w, ov := longWindowRefusals(c, first, res)
		reasons, windows, over = append(reasons, r...), w, ov
	}
	if windows == 0 {
		why := ""
		if c.NoData != "" {
			why = ": " + c.NoData
		}
		return append(reasons, "no measured principal-"+c.Window+"s"+why)
	}
	maxShare := o.MaxLimitedShare
	if maxShare == 0 {
		maxShare = DefaultMaxLimitedShare
	}
	// "Not under" rather than ">=": a NaN bound refuses instead of admitting.
	if share := float64(over) / float64(windows); !(share < maxShare) {
		reasons = append(reasons, fmt.Sprintf("%d of %d principal-%ss over the cap (%.2f%%), not under %.2f%%; suggested cap %d",
			over, windows, c.Window, share*100, maxShare*100, c.SuggestedCap))
	}
	return reasons
}

// coverage is what a day or hour cap's evidence shows on the full shadow days.
type coverage struct {
	days, windows, over int
	reasons             []string
}

// coveredDays counts the full shadow days first..last a day or hour cap
// covers, and its principal-windows (override principals' included: their
// rules are enforced too) on those days. Today's partial day never counts.
func coveredDays(c *report.Cap, first, last time.Time) coverage {
	var cov coverage
	inRange := func(name string, partial bool) (string, bool) {
		if len(name) < len(report.DateLayout) || partial {
			return "", false
		}
		day, err := time.Parse(report.DateLayout, name[:len(report.DateLayout)])
		return name[:len(report.DateLayout)], err == nil && !day.Before(first) && !day.After(last)
	}
	days := map[string]bool{}
	seen := map[string]bool{}
	hours := map[string]int{} // an hour cap's listed hours per UTC date
	for _, w := range c.PerWindow {
		day, ok := inRange(w.Window, w.Partial)
		if !ok {
			continue
		}
		if seen[w.Window] {
			// A report lists each window once; a repeated one (an edited
			// file) must not stretch the coverage.
			cov.reasons = append(cov.reasons, fmt.Sprintf("evidence lists %s twice", w.Window))
			continue
		}
		seen[w.Window] = true
		hours[day]++
		if w.PrincipalWindows > 0 || w.Would429 > 0 || w.Denied > 0 {
			days[day] = true
		}
		cov.windows += w.PrincipalWindows
		cov.over += w.OverCap
	}
	if c.Window == "hour" {
		// Hour windows are named by their UTC date. A report in another
		// zone lists its local days' hours, which touch one more UTC date
		// than they cover: a UTC day counts only with all 24 of its hours
		// in the evidence.
		for day := range days {
			if hours[day] < 24 {
				delete(days, day)
			}
		}
	}
	for _, ov := range c.Overridden {
		for _, w := range ov.PerWindow {
			if _, ok := inRange(w.Window, w.Partial); ok && seen[w.Window] {
				cov.windows += w.PrincipalWindows
				cov.over += w.OverCap
			}
		}
	}
	cov.days = len(days)
	return cov
}

// longWindowRefusals judges a week or month cap: on windows that start on
// or after the first full shadow day, or on a projection of at least
// RequiredFullDays measured days (then noted in the result).
func longWindowRefusals(c *report.Cap, first time.Time, res *Result) ([]string, int, int) {
	var reasons []string
	if p := c.Judged.Projection; p != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("%s per %s judged on a projection of %s (x%.2f from %.1f days)", c.Measure, c.Window, p.Window, p.Factor, p.ObservedHours/24))
		if p.ObservedHours < float64(RequiredFullDays*24) {
			reasons = append(reasons, fmt.Sprintf("the projection of %s rests on %.1f days measured; a promotion needs %d", p.Window, p.ObservedHours/24, RequiredFullDays))
		}
		if from, err := time.Parse(time.RFC3339, p.ObservedFrom); err != nil || from.Before(first) {
			reasons = append(reasons, fmt.Sprintf("the projection of %s starts before the first full shadow day %s", p.Window, first.Format(report.DateLayout)))
		}
	} else if from, err := time.Parse(time.RFC3339, c.Judged.From); err != nil || from.Before(first) {
		reasons = append(reasons, fmt.Sprintf("judged on %s, which starts before the first full shadow day %s", c.Judged.Text, first.Format(report.DateLayout)))
	}
	windows, over := c.Summary.PrincipalWindows, c.Summary.OverCap
	for _, ov := range c.Overridden {
		windows += ov.Summary.PrincipalWindows
		over += ov.Summary.OverCap
	}
	return reasons, windows, over
}

func sortedKeys(m map[string]uint64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// WriteFileAtomic writes data to path through a temporary file in the same
// directory and a rename (internal/atomicfile), keeping path's permissions and,
// when path is a symbolic link, the link: a failure leaves the old file
// untouched and never a partial one, and the directory is synced. A file no
// one may write (chmod a-w: frozen on purpose) is refused, not replaced.
func WriteFileAtomic(path string, data []byte) error {
	perm := atomicfile.DefaultPerm
	if st, err := os.Stat(path); err == nil {
		perm = st.Mode().Perm()
		if perm&0o222 == 0 {
			return fmt.Errorf("%s is read-only (mode %04o): not replaced; make it writable (chmod u+w) to edit it", path, perm)
		}
	}
	return atomicfile.WriteFile(path, data, atomicfile.Options{Perm: perm})
}
