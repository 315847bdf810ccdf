package assert

import (
	"fmt"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
	"gopkg.in/yaml.v3"

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
