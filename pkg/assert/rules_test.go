package assert

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// fixtureValidator, when set (by a test file that can build one), is used for
// BG007 in the fixture tests.
var fixtureValidator Validator

var (
	wantRE      = regexp.MustCompile(`#\s*want:\s*((?:BG\d{3}\s*)+)`)
	directiveRE = regexp.MustCompile(`^#\s*(skip|allow-enforce|envoy-gateway-version|spec-enforced|spec-budgets):\s*(.+)$`)
)

// fixture is a testdata/rules file: the objects plus, analysistest style, the
// expected findings as "# want: BG00X" comments on the offending lines and
// option directives in leading comments.
type fixture struct {
	path string
	objs []*manifest.Object
	want []string // "line:ID", sorted
	opts Options
}

func loadFixture(t *testing.T, path string) fixture {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fx := fixture{path: path}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if m := wantRE.FindStringSubmatch(text); m != nil {
			for _, id := range strings.Fields(m[1]) {
				fx.want = append(fx.want, fmt.Sprintf("%d:%s", line, id))
			}
		}
		if m := directiveRE.FindStringSubmatch(strings.TrimSpace(text)); m != nil {
			vals := strings.Fields(m[2])
			switch m[1] {
			case "skip":
				fx.opts.Skip = append(fx.opts.Skip, vals...)
			case "allow-enforce":
				fx.opts.AllowEnforce = append(fx.opts.AllowEnforce, vals...)
			case "envoy-gateway-version":
				fx.opts.EnvoyGatewayVersion = vals[0]
			case "spec-budgets":
				if fx.opts.Spec == nil {
					fx.opts.Spec = &SpecFacts{File: "spec.yaml", Enforced: map[string]bool{}}
				}
				fx.opts.Spec.Budgets = map[string]bool{}
				for _, v := range vals {
					fx.opts.Spec.Budgets[v] = true
				}
			case "spec-enforced":
				if fx.opts.Spec == nil {
					fx.opts.Spec = &SpecFacts{File: "spec.yaml", Enforced: map[string]bool{}}
				}
				for _, v := range vals {
					fx.opts.Spec.Enforced[v] = true
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(fx.want)
	fx.objs, err = manifest.Parse(path, data, manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fx.opts.Validator = fixtureValidator
	return fx
}

func got(rep *Report) []string {
	var out []string
	for _, f := range rep.Findings {
		out = append(out, fmt.Sprintf("%d:%s", f.Line, f.Rule))
	}
	sort.Strings(out)
	return out
}

// TestRuleFixtures runs every fixture and compares the exact multiset of
// (line, rule) findings with its want comments. A fixture named bgNNN_* must
// fail for BGNNN only; clean_* fixtures must have no finding; mixed_* ones
// (realistic inputs) may fail for several rules.
func TestRuleFixtures(t *testing.T) {
	paths, err := filepath.Glob("testdata/rules/*.yaml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	covered := map[string]bool{}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			fx := loadFixture(t, path)
			rep, err := Run(context.Background(), fx.objs, fx.opts)
			if err != nil {
				t.Fatal(err)
			}
			g := got(rep)
			if strings.Join(g, " ") != strings.Join(fx.want, " ") {
				var msgs []string
				for _, f := range rep.Findings {
					msgs = append(msgs, fmt.Sprintf("  %d:%d %s %s", f.Line, f.Column, f.Rule, f.Message))
				}
				t.Errorf("findings %v, want %v\n%s", g, fx.want, strings.Join(msgs, "\n"))
			}
			base := filepath.Base(path)
			if strings.HasPrefix(base, "mixed_") {
				return
			}
			if strings.HasPrefix(base, "clean_") {
				if len(fx.want) != 0 {
					t.Errorf("clean fixture has want comments")
				}
				return
			}
			id := strings.ToUpper(base[:5])
			if len(fx.want) == 0 {
				t.Errorf("fixture %s expects no finding", base)
			}
			for _, w := range fx.want {
				if !strings.HasSuffix(w, ":"+id) {
					t.Errorf("fixture for %s also expects %s", id, w)
				}
			}
			covered[id] = true
		})
	}
	for _, r := range Rules() {
		if r.ID == "BG007" && fixtureValidator == nil || r.ID == "BG008" {
			continue // BG007 needs a validator (schema_test.go), BG008 a rendered set (drift_test.go)
		}
		if !covered[r.ID] {
			t.Errorf("no fixture for %s", r.ID)
		}
	}
}

func TestSkip(t *testing.T) {
	fx := loadFixture(t, "testdata/rules/bg001_not_shared.yaml")
	fx.opts.Skip = append(fx.opts.Skip, "bg001")
	rep, err := Run(context.Background(), fx.objs, fx.opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Findings) != 0 {
		t.Errorf("findings with BG001 skipped: %v", got(rep))
	}
	for _, r := range rep.Rules {
		if r.ID == "BG001" {
			t.Errorf("skipped rule reported as run")
		}
	}
	if _, err := Run(context.Background(), fx.objs, Options{Skip: []string{"BG999"}}); err == nil || !strings.Contains(err.Error(), "BG999") {
		t.Errorf("unknown skip ID: %v", err)
	}
}

func TestFailOn(t *testing.T) {
	fx := loadFixture(t, "testdata/rules/bg010_shared_cost.yaml")
	rep, err := Run(context.Background(), fx.objs, fx.opts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed(Error) || !rep.Failed(Warning) || rep.Count(Warning) != 1 {
		t.Errorf("a warning-only report: failed(error)=%v failed(warning)=%v", rep.Failed(Error), rep.Failed(Warning))
	}
}

func TestFindingsAreSortedAndDeterministic(t *testing.T) {
	var objs []*manifest.Object
	for _, p := range []string{"testdata/rules/bg006_identity.yaml", "testdata/rules/bg003_cost.yaml", "testdata/rules/bg001_not_shared.yaml"} {
		objs = append(objs, loadFixture(t, p).objs...)
	}
	a, err := Run(context.Background(), objs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Run(context.Background(), objs, Options{})
	if fmt.Sprint(a.Findings) != fmt.Sprint(b.Findings) {
		t.Error("two runs differ")
	}
	if !sort.SliceIsSorted(a.Findings, func(i, j int) bool {
		x, y := a.Findings[i], a.Findings[j]
		if x.File != y.File {
			return x.File < y.File
		}
		return x.Line < y.Line
	}) {
		t.Error("findings not sorted")
	}
	for _, f := range a.Findings {
		if f.File == "" || f.Line == 0 || f.Column == 0 || f.Object == "" || f.Message == "" {
			t.Errorf("finding without position or object: %+v", f)
		}
	}
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]Version{"v1.8.1": {1, 8, 1}, "1.9": {1, 9, 0}, "v1.7.0-rc.1": {1, 7, 0}} {
		v, err := ParseVersion(in)
		if err != nil || v != want {
			t.Errorf("ParseVersion(%q) = %v, %v", in, v, err)
		}
	}
	for _, bad := range []string{"", "1", "v1.x.0", "1.2.3.4"} {
		if _, err := ParseVersion(bad); err == nil {
			t.Errorf("ParseVersion(%q) accepted", bad)
		}
	}
	if _, err := Run(context.Background(), nil, Options{EnvoyGatewayVersion: "banana"}); err == nil {
		t.Error("bad version accepted by Run")
	}
}
