package render

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"

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
			if !errors.As(err, &le) && !errors.As(err, &ue) && !hasBasePolicy(bs) {
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

func hasBasePolicy(bs *spec.BudgetSet) bool {
	for _, gw := range bs.Spec.Gateways {
		if gw.BasePolicy != "" {
			return true
		}
	}
	return false
}

// FuzzBasePolicy: any base policy file either merges (the budgets after its
// own global rules, the annotation numbering them from there) or fails with
// an error; it never panics.
func FuzzBasePolicy(f *testing.F) {
	for _, p := range []string{"testdata/base/gateway-team-btp.yaml", "testdata/base/local.yaml", "testdata/base/other-target.yaml"} {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte("apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {name: x}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		bs, err := spec.LoadFile("testdata/base_policy.yaml", nil)
		if err != nil {
			t.Fatal(err)
		}
		bs.Spec.Gateways[0].Base = &spec.File{Path: "base.yaml", Data: data}
		res, err := Render(bs)
		if err != nil {
			return
		}
		btp := res.Objects[0].Object.(*egv1a1.BackendTrafficPolicy)
		rbs, err := RuleBudgets(btp.Annotations)
		if err != nil {
			t.Fatalf("merged annotation: %v", err)
		}
		rules := btp.Spec.RateLimit.Global.Rules
		if n := len(rules); n != rbs[len(rbs)-1].Rule+1 || rbs[0].Rule != n-RuleCount(bs) {
			t.Fatalf("annotation %v does not number the last %d of %d rules", rbs, RuleCount(bs), n)
		}
	})
}
