package render

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/spec"
)

// FuzzRender: any spec that loads either renders deterministically, with an
// annotation entry per rule, or fails with a LimitError; it never panics.
func FuzzRender(f *testing.F) {
	paths, _ := filepath.Glob("testdata/*.yaml")
	paths = append(paths, "../../examples/budgets.yaml")
	for _, p := range paths {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(manyOverrides(3)))
	f.Fuzz(func(t *testing.T, data []byte) {
		bs, err := spec.Load(data, "f.yaml")
		if err != nil {
			return
		}
		res, err := Render(bs)
		if err != nil {
			var le *LimitError
			var ue *UnsupportedError
			if !errors.As(err, &le) && !errors.As(err, &ue) {
				t.Fatalf("render error is not a LimitError or UnsupportedError: %v", err)
			}
			return
		}
		again, err := Render(bs)
		if err != nil || !bytes.Equal(res.YAML(), again.YAML()) {
			t.Fatalf("second render differs (err %v)", err)
		}
		for _, o := range res.Objects {
			if o.Kind != "BackendTrafficPolicy" {
				continue
			}
			rbs, err := RuleBudgets(btpAnnotations(t, o))
			if err != nil {
				t.Fatal(err)
			}
			if want := ruleCountOf(bs, o); len(rbs) != want {
				t.Fatalf("annotation has %d entries, spec needs %d rules", len(rbs), want)
			}
		}
	})
}

// ruleCountOf is how many rules the Gateway of a rendered policy carries.
func ruleCountOf(bs *spec.BudgetSet, o Object) int {
	for _, gw := range bs.Spec.Gateways {
		if gw.Namespace == o.Namespace && PolicyName(bs, gw) == o.Name {
			return RuleCountFor(bs, gw)
		}
	}
	return -1
}

func btpAnnotations(t *testing.T, o Object) map[string]string {
	t.Helper()
	type annotated interface{ GetAnnotations() map[string]string }
	a, ok := o.Object.(annotated)
	if !ok {
		t.Fatalf("%T has no annotations", o.Object)
	}
	return a.GetAnnotations()
}
