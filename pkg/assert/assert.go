// Package assert is budgetgen's render gate: rules over committed Kubernetes
// manifests that fail the build when a token budget would not bind, not be
// shared, not be shadowed during rollout, or could be spoofed.
//
// Rules are registered values (Rule, one file each, see Rules) and the driver
// (Run) is separate, in the manner of golang.org/x/tools/go/analysis. Findings
// are data: a rule ID, a severity and a position; a Go error only means the
// run could not go on.
//
// A caller reads the manifests with pkg/manifest, runs the gate with Run
// (Options: the spec's facts, rules to skip, a schema validator such as
// pkg/assert/crd's) and reads the Report. Pass, Index and the types they
// carry are what the registered rules are written against; a caller does
// not need them.
package assert

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// Severity says whether a finding fails the gate by default.
type Severity int

// Severities, ordered: a gate failing on Warning also fails on Error.
const (
	Warning Severity = 1
	Error   Severity = 2
)

func (s Severity) String() string {
	switch s {
	case Warning:
		return "warning"
	case Error:
		return "error"
	}
	return fmt.Sprintf("severity(%d)", int(s))
}

// MarshalText writes the severity's name (for JSON output).
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// ParseSeverity reads "error" or "warning".
func ParseSeverity(s string) (Severity, error) {
	switch strings.ToLower(s) {
	case "error":
		return Error, nil
	case "warning":
		return Warning, nil
	}
	return 0, fmt.Errorf("unknown severity %q (want error or warning)", s)
}

// Finding is one violated invariant at one place.
type Finding struct {
	// Rule is the stable rule ID, such as BG001.
	Rule     string   `json:"rule"`
	Severity Severity `json:"severity"`
	// Message is one line saying what is wrong and what to do.
	Message string `json:"message"`
	// File, Line and Column locate the offending YAML node (1-based).
	File   string `json:"file"`
	Line   int    `json:"line"`
	Column int    `json:"column"`
	// Path is the field path inside the object, e.g. spec.rateLimit.global.rules[2].shared.
	Path string `json:"path,omitempty"`
	// Object is "Kind namespace/name".
	Object string `json:"object,omitempty"`
	// Detail is optional multi-line context, such as a drift diff.
	Detail string `json:"detail,omitempty"`
}

// Rule is one registered check.
type Rule struct {
	// ID is stable across releases (BG001...). --skip and docs use it.
	ID string
	// Name is a short kebab-case name.
	Name string
	// Doc is the one-line summary; docs/assert.md has the full entry.
	Doc string
	// Severity of the rule's findings.
	Severity Severity
	// Check inspects the pass and reports findings; an error stops the run.
	Check func(*Pass) error
}

// Pass is what a rule sees: the objects, the options, and a way to report.
type Pass struct {
	Context context.Context
	Index   *Index
	Options *Options
	rule    *Rule
	out     *[]Finding
}

// Report records a finding on node n (nil: the object itself) of obj.
func (p *Pass) Report(obj *manifest.Object, n *yaml.Node, path, format string, args ...any) {
	p.report(obj, n, path, "", fmt.Sprintf(format, args...))
}

// ReportDetail is Report with multi-line detail (a diff, a list).
func (p *Pass) ReportDetail(obj *manifest.Object, n *yaml.Node, path, detail, format string, args ...any) {
	p.report(obj, n, path, detail, fmt.Sprintf(format, args...))
}

// ReportSeverity is Report with a severity other than the rule's: a rule
// that can only say "not checked" reports that as a warning next to its errors.
func (p *Pass) ReportSeverity(sev Severity, obj *manifest.Object, n *yaml.Node, path, format string, args ...any) {
	p.reportSev(sev, obj, n, path, "", fmt.Sprintf(format, args...))
}

func (p *Pass) report(obj *manifest.Object, n *yaml.Node, path, detail, msg string) {
	p.reportSev(p.rule.Severity, obj, n, path, detail, msg)
}

func (p *Pass) reportSev(sev Severity, obj *manifest.Object, n *yaml.Node, path, detail, msg string) {
	f := Finding{Rule: p.rule.ID, Severity: sev, Message: msg, Path: path, Detail: detail}
	if obj != nil {
		f.File = obj.File
		f.Object = obj.String()
		if n == nil {
			n = obj.Node
		}
	}
	if n != nil {
		f.Line, f.Column = n.Line, n.Column
	}
	*p.out = append(*p.out, f)
}

// ReportAt records a finding at a file position not tied to an object (for
// example the spec, when render produces an object nobody committed).
func (p *Pass) ReportAt(file string, line int, detail, format string, args ...any) {
	*p.out = append(*p.out, Finding{Rule: p.rule.ID, Severity: p.rule.Severity, Message: fmt.Sprintf(format, args...), File: file, Line: line, Detail: detail})
}

// Report is the result of a run.
type Report struct {
	// Findings, sorted by file, line, column, rule and message.
	Findings []Finding
	// Rules that ran (skipped ones excluded), in ID order.
	Rules []*Rule
	// Objects is the number of objects checked; Files the distinct input files.
	Objects int
	Files   []string
	// BudgetPolicies is how many budget policies the input holds: Envoy
	// Gateway BackendTrafficPolicies with token rules or the rule-budgets
	// annotation, and AgentgatewayPolicies with a global rate limit. A gate
	// given none checked nothing: the CLI fails unless --allow-empty.
	BudgetPolicies int
}

// Count returns the number of findings of severity s.
func (r *Report) Count(s Severity) int {
	n := 0
	for _, f := range r.Findings {
		if f.Severity == s {
			n++
		}
	}
	return n
}

// Failed reports whether any finding is at or above failOn.
func (r *Report) Failed(failOn Severity) bool {
	for _, f := range r.Findings {
		if f.Severity >= failOn {
			return true
		}
	}
	return false
}

// Run checks objs with every registered rule not skipped in opts.
func Run(ctx context.Context, objs []*manifest.Object, opts Options) (*Report, error) {
	opts = opts.withDefaults()
	skip := map[string]bool{}
	for _, id := range opts.Skip {
		id = strings.ToUpper(strings.TrimSpace(id))
		if Lookup(id) == nil {
			return nil, fmt.Errorf("skip %q: unknown rule ID (known: %s)", id, strings.Join(IDs(), ", "))
		}
		skip[id] = true
	}
	ix := NewIndex(objs)
	rep := &Report{Objects: len(objs), BudgetPolicies: len(ix.BudgetPolicies()) + len(agentgatewayBudgetPolicies(ix))}
	files := map[string]bool{}
	for _, o := range objs {
		if !files[o.File] {
			files[o.File] = true
			rep.Files = append(rep.Files, o.File)
		}
	}
	sort.Strings(rep.Files)
	var findings []Finding
	for _, r := range Rules() {
		if skip[r.ID] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		rep.Rules = append(rep.Rules, r)
		p := &Pass{Context: ctx, Index: ix, Options: &opts, rule: r, out: &findings}
		if err := r.Check(p); err != nil {
			return nil, fmt.Errorf("rule %s: %w", r.ID, err)
		}
	}
	SortFindings(findings)
	rep.Findings = findings
	return rep, nil
}

// SortFindings orders findings by file, line, column, rule, message.
func SortFindings(fs []Finding) {
	sort.SliceStable(fs, func(i, j int) bool {
		a, b := fs[i], fs[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Column != b.Column {
			return a.Column < b.Column
		}
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		return a.Message < b.Message
	})
}
