package assert

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleDrift: with --spec, what is committed must be what render produces
// today; otherwise a hand edit (or a stale render) is what gets applied.
// Objects are compared as data (key order, quoting and comments ignored;
// status and a null creationTimestamp dropped), and shown as a unified diff
// of their canonical YAML.
var ruleDrift = &Rule{
	ID:       "BG008",
	Name:     "drift",
	Doc:      "with --spec, the committed budget objects equal what budgetgen render produces now",
	Severity: Error,
	Check: func(p *Pass) error {
		if p.Options.Rendered == nil {
			return nil
		}
		committed := map[string]*manifest.Object{}
		for _, o := range p.Index.Objects {
			committed[objKey(o)] = o
		}
		rendered := map[string]bool{}
		specFile := ""
		if p.Options.Spec != nil {
			specFile = p.Options.Spec.File
		}
		for _, want := range p.Options.Rendered {
			k := objKey(want)
			rendered[k] = true
			got, ok := committed[k]
			if !ok {
				p.ReportAt(specFile, 1, "", "render produces %s, which is not in the committed manifests: run budgetgen render and commit its output", want)
				continue
			}
			a, err := canonical(got)
			if err != nil {
				// The committed YAML does not decode (a duplicate key, say):
				// the API server would refuse it too. A finding, not a crash.
				p.Report(got, nil, "", "%s cannot be compared with what render produces: %v", got, err)
				continue
			}
			b, err := canonical(want)
			if err != nil {
				return err
			}
			if a == b {
				continue
			}
			diff, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
				A: difflib.SplitLines(a), B: difflib.SplitLines(b),
				FromFile: "committed " + got.File, ToFile: "rendered", Context: 3,
			})
			if err != nil {
				return fmt.Errorf("diff %s: %w", got, err)
			}
			if missing := lacksUnidentifiedRules(got, want); len(missing) > 0 {
				p.ReportDetail(got, nil, "", diff, "%s differs from what render produces now: it lacks the rules for requests without an identity header (principal %s) of %s, so an older budgetgen rendered it, and on this Gateway a request carrying none of the identity headers is charged to none of %s: run budgetgen render and commit its output",
					got, agentgateway.NoClaim, budgetList(missing), pronoun(missing))
				continue
			}
			p.ReportDetail(got, nil, "", diff, "%s differs from what render produces now: run budgetgen render and commit its output", got)
		}
		for _, o := range p.Index.Objects {
			if rendered[objKey(o)] || !madeByBudgetgen(o) {
				continue
			}
			p.Report(o, nil, "", "%s looks rendered by budgetgen but render no longer produces it: delete it or render again", o)
		}
		return nil
	},
}

// lacksUnidentifiedRules names the budgets whose rules for requests without
// an identity header (rule-budgets principal budgetgen/no-claim) the rendered
// BackendTrafficPolicy has and the committed one lacks: what a render by a
// budgetgen from before those rules looks like.
func lacksUnidentifiedRules(committed, rendered *manifest.Object) []string {
	count := func(o *manifest.Object) map[string]int {
		n := map[string]int{}
		if o.Group() != GroupEG || o.Kind != "BackendTrafficPolicy" {
			return n
		}
		var rbs []ruleBudget
		_ = json.Unmarshal([]byte(manifest.Str(manifest.Get(o.Node, "metadata", "annotations", RuleBudgetsAnnotation))), &rbs) // BG002 reports an unreadable annotation
		for _, rb := range rbs {
			if rb.Principal == agentgateway.NoClaim {
				n[rb.Budget]++
			}
		}
		return n
	}
	have := count(committed)
	var out []string
	for b, n := range count(rendered) {
		if have[b] < n {
			out = append(out, b)
		}
	}
	sort.Strings(out)
	return out
}

func budgetList(names []string) string {
	if len(names) == 1 {
		return "budget " + names[0]
	}
	return "budgets " + strings.Join(names, ", ")
}

func pronoun(names []string) string {
	if len(names) == 1 {
		return "it"
	}
	return "them"
}

func objKey(o *manifest.Object) string {
	return o.Group() + "/" + o.Kind + "/" + o.Namespace + "/" + o.Name
}

func madeByBudgetgen(o *manifest.Object) bool {
	if manifest.Get(o.Node, "metadata", "annotations", RuleBudgetsAnnotation) != nil {
		return true
	}
	return manifest.Str(manifest.Get(o.Node, "metadata", "labels", "app.kubernetes.io/managed-by")) == "budgetgen"
}

// canonical renders an object as YAML with sorted keys (yaml.v3 sorts map
// keys when encoding) and without the
// fields the API server owns.
func canonical(o *manifest.Object) (string, error) {
	v, err := o.Decode()
	if err != nil {
		return "", err
	}
	delete(v, "status")
	if md, ok := v["metadata"].(map[string]any); ok {
		if ts, ok := md["creationTimestamp"]; ok && ts == nil {
			delete(md, "creationTimestamp")
		}
	}
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return "", fmt.Errorf("encode %s: %w", o, err)
	}
	return b.String(), enc.Close()
}
