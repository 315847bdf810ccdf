package assert

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/manifest"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// TestDrift compares committed objects with a rendered set given as data:
// formatting, key order and API-server fields are not drift; a changed value
// is (with a unified diff); so is a budgetgen object render no longer makes,
// and a rendered object nobody committed (reported at the spec).
func TestDrift(t *testing.T) {
	fx := loadFixture(t, "testdata/drift/committed.yaml")
	data, err := os.ReadFile("testdata/drift/rendered.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := manifest.Parse("<render>", data, manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	extra := "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {name: new-gw, namespace: gw}\n"
	more, err := manifest.Parse("<render>", []byte(extra), manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Skip: []string{"BG007"}, Spec: &SpecFacts{File: "spec.yaml"}, Rendered: append(rendered, more...)}
	rep, err := Run(context.Background(), fx.objs, opts)
	if err != nil {
		t.Fatal(err)
	}
	var atSpec, inFile []string
	var diff string
	for _, f := range rep.Findings {
		if f.Rule != "BG008" {
			t.Errorf("unexpected %s: %s", f.Rule, f.Message)
			continue
		}
		if f.File == "spec.yaml" {
			atSpec = append(atSpec, f.Message)
			continue
		}
		inFile = append(inFile, f.File)
		if f.Detail != "" {
			diff = f.Detail
		}
	}
	g := got(&Report{Findings: filterFile(rep.Findings, fx.path)})
	if strings.Join(g, " ") != strings.Join(fx.want, " ") {
		t.Errorf("findings %v, want %v", g, fx.want)
	}
	// Every finding not at the spec is in the committed file: none lands
	// in another file (which the filtered check above would not see).
	if len(inFile) != len(fx.want) {
		t.Errorf("%d findings outside the spec, want %d (%v)", len(inFile), len(fx.want), inFile)
	}
	for _, file := range inFile {
		if file != fx.path {
			t.Errorf("finding in %s, want it in %s or at the spec", file, fx.path)
		}
	}
	if len(atSpec) != 1 || !strings.Contains(atSpec[0], "render produces BackendTrafficPolicy gw/new-gw") {
		t.Errorf("findings at the spec: %v", atSpec)
	}
	for _, want := range []string{"--- committed testdata/drift/committed.yaml", "+++ rendered", "-            requests: 9000000", "+            requests: 5000000"} {
		if !strings.Contains(diff, want) {
			t.Errorf("diff lacks %q:\n%s", want, diff)
		}
	}
	// Without a rendered set, BG008 does not run.
	rep, err = Run(context.Background(), fx.objs, Options{Skip: []string{"BG007"}})
	if err != nil || len(rep.Findings) != 0 {
		t.Errorf("drift without a rendered set: %v %v", got(rep), err)
	}
}

func filterFile(fs []Finding, file string) []Finding {
	var out []Finding
	for _, f := range fs {
		if f.File == file {
			out = append(out, f)
		}
	}
	return out
}

// TestDriftUndecodableCommitted: a committed object whose YAML does not
// decode (a duplicate key, which the API server refuses too) is a BG008
// finding that says why, not an error of the whole run (found by FuzzAssert).
func TestDriftUndecodableCommitted(t *testing.T) {
	committed, err := manifest.Parse("c.yaml", []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata:\n  k: x\n  k: y\n"), manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := manifest.Parse("<render>", []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: x}\n"), manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), committed, Options{Skip: []string{"BG007"}, Spec: &SpecFacts{File: "spec.yaml"}, Rendered: rendered})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if len(rep.Findings) != 1 || rep.Findings[0].Rule != "BG008" || !strings.Contains(rep.Findings[0].Message, "already defined") {
		t.Fatalf("findings %+v", rep.Findings)
	}
}

// TestDriftOlderRender: a BackendTrafficPolicy rendered by a budgetgen from
// before the rules for requests without an identity header is drift that
// says so, naming the per-principal budgets that lack them (per-api-key,
// not the group budget fleet), with the diff.
func TestDriftOlderRender(t *testing.T) {
	const dir = "testdata/drift/older-budgetgen"
	fx := loadFixture(t, dir+"/committed.yaml")
	bs, err := spec.LoadFile(dir+"/spec.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := render.Render(bs)
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := manifest.Parse("<render>", res.YAML(), manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), fx.objs, Options{Spec: &SpecFacts{File: dir + "/spec.yaml"}, Rendered: rendered})
	if err != nil {
		t.Fatal(err)
	}
	var drift []Finding
	for _, f := range rep.Findings {
		if f.Rule == "BG008" && f.File == fx.path {
			drift = append(drift, f)
		}
	}
	if g := got(&Report{Findings: drift}); strings.Join(g, " ") != strings.Join(fx.want, " ") {
		t.Fatalf("BG008 findings %v, want %v", g, fx.want)
	}
	msg := drift[0].Message
	for _, want := range []string{"lacks the rules for requests without an identity header (principal budgetgen/no-claim) of budget per-api-key", "an older budgetgen rendered it", "run budgetgen render"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q: %s", want, msg)
		}
	}
	if !strings.Contains(drift[0].Detail, "type: RegularExpression\n+                  value: .*") {
		t.Errorf("diff does not show the new rule:\n%s", drift[0].Detail)
	}
}
