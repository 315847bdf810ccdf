// Package pkg_test checks the promise of pkg/: every package under it is a
// library another module can call, so none of its exported API names a
// type another module cannot import (one under internal/).
package pkg_test

import (
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

const mod = "github.com/budgetgen/budgetgen"

// exportData lists the packages the patterns match and the compiler's
// export data of them and of every dependency (go list -export -deps), so
// the test reads the API the compiler sees without type-checking the
// dependency tree from source.
func exportData(t *testing.T, patterns ...string) (roots []string, files map[string]string) {
	t.Helper()
	run := func(args ...string) string {
		out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
		if err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				t.Fatalf("go list %v: %v\n%s", args, err, ee.Stderr)
			}
			t.Fatalf("go list %v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	roots = strings.Fields(run(append([]string{"-f", "{{if .GoFiles}}{{.ImportPath}}{{end}}"}, patterns...)...))
	files = map[string]string{}
	for _, line := range strings.Split(run(append([]string{"-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}, patterns...)...), "\n") {
		path, file, ok := strings.Cut(line, "\t")
		if ok && file != "" {
			files[path] = file
		}
	}
	return roots, files
}

// consultSources reads every Go file under pkg/. go test caches a passing
// result keyed on the files the test itself opens, and the export data comes
// through a go list subprocess it cannot see: without this, an exposure added
// to a package the test binary does not import would still pass from the cache.
func consultSources(t *testing.T) {
	t.Helper()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		_, err = os.ReadFile(path)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// importAll loads the packages from their export data.
func importAll(t *testing.T, roots []string, files map[string]string) []*types.Package {
	t.Helper()
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		f, ok := files[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	var out []*types.Package
	for _, p := range roots {
		pkg, err := imp.Import(p)
		if err != nil {
			t.Fatalf("import %s: %v", p, err)
		}
		out = append(out, pkg)
	}
	return out
}

// isInternal reports whether a package path is one other modules cannot
// import: this module's internal/ tree.
func isInternal(path string) bool {
	return path == mod+"/internal" || strings.HasPrefix(path, mod+"/internal/")
}

// exposures walks everything a caller of a package can reach through its
// exported names: the types of constants and variables, function and
// method signatures, exported struct fields and embedded types (whose
// fields and methods are promoted even when the embedded type is
// unexported), interface methods, type arguments and constraints. It
// follows this module's named types into their structure and stops at
// other modules' types, which cannot name ours.
type exposures struct {
	seen  map[*types.TypeName]bool
	found map[string]bool // "via: type" lines
}

func (e *exposures) report(via string, t types.Type) {
	e.found[fmt.Sprintf("%s: %s", via, types.TypeString(t, nil))] = true
}

func (e *exposures) typ(via string, t types.Type) {
	switch t := t.(type) {
	case *types.Alias:
		if obj := t.Obj(); obj.Pkg() != nil && isInternal(obj.Pkg().Path()) {
			e.report(via, t)
		}
		e.typ(via, types.Unalias(t))
	case *types.Named:
		e.named(via, t)
	case *types.Pointer:
		e.typ(via, t.Elem())
	case *types.Slice:
		e.typ(via, t.Elem())
	case *types.Array:
		e.typ(via, t.Elem())
	case *types.Chan:
		e.typ(via, t.Elem())
	case *types.Map:
		e.typ(via, t.Key())
		e.typ(via, t.Elem())
	case *types.Signature:
		e.tuple(via+" param", t.Params())
		e.tuple(via+" result", t.Results())
		for i := 0; i < t.TypeParams().Len(); i++ {
			e.typ(via+" type parameter", t.TypeParams().At(i).Constraint())
		}
	case *types.Struct:
		for i := 0; i < t.NumFields(); i++ {
			if f := t.Field(i); f.Exported() || f.Embedded() {
				e.typ(via+"."+f.Name(), f.Type())
			}
		}
	case *types.Interface:
		for i := 0; i < t.NumEmbeddeds(); i++ {
			e.typ(via+" embedded", t.EmbeddedType(i))
		}
		for i := 0; i < t.NumMethods(); i++ {
			if m := t.Method(i); m.Exported() {
				e.typ(via+"."+m.Name(), m.Type())
			}
		}
	case *types.Union:
		for i := 0; i < t.Len(); i++ {
			e.typ(via+" union", t.Term(i).Type())
		}
	case *types.TypeParam:
		e.typ(via+" constraint", t.Constraint())
	}
}

func (e *exposures) tuple(via string, t *types.Tuple) {
	for i := 0; i < t.Len(); i++ {
		e.typ(via, t.At(i).Type())
	}
}

func (e *exposures) named(via string, t *types.Named) {
	obj := t.Obj()
	if obj.Pkg() == nil {
		return // error, comparable
	}
	if isInternal(obj.Pkg().Path()) {
		e.report(via, t)
		return
	}
	for i := 0; i < t.TypeArgs().Len(); i++ {
		e.typ(via+" type argument", t.TypeArgs().At(i))
	}
	path := obj.Pkg().Path()
	if path != mod && !strings.HasPrefix(path, mod+"/") {
		return // another module's type cannot name this module's internal ones
	}
	if e.seen[obj] {
		return
	}
	e.seen[obj] = true
	name := obj.Pkg().Name() + "." + obj.Name()
	e.typ(name, t.Underlying())
	for i := 0; i < t.NumMethods(); i++ {
		if m := t.Method(i); m.Exported() {
			e.typ(name+"."+m.Name(), m.Type())
		}
	}
}

// scan lists the exposures of the packages' exported names, sorted.
func scan(pkgs []*types.Package) []string {
	e := &exposures{seen: map[*types.TypeName]bool{}, found: map[string]bool{}}
	for _, pkg := range pkgs {
		scope := pkg.Scope()
		for _, name := range scope.Names() {
			obj := scope.Lookup(name)
			if !obj.Exported() {
				continue
			}
			e.typ(pkg.Name()+"."+name, obj.Type())
		}
	}
	out := make([]string, 0, len(e.found))
	for l := range e.found {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

// TestNoInternalTypeInPublicAPI: no exported name of a package under pkg/
// takes, returns or exposes (through a field, a method, an embedded or an
// aliased type) a type of this module's internal/ tree, so another module
// can call every public function and fill every public struct.
func TestNoInternalTypeInPublicAPI(t *testing.T) {
	consultSources(t)
	roots, files := exportData(t, "./...")
	if len(roots) < 5 {
		t.Fatalf("go list ./... under pkg/ found %d packages: %v", len(roots), roots)
	}
	for _, l := range scan(importAll(t, roots, files)) {
		t.Errorf("%s is an internal type (give the public package its own type, or move this API to internal/)", l)
	}
}

// TestRenderedValuesArePublic: render.Object.Object is typed any, so the
// check above cannot see what it holds. Render the examples, which between
// them render every kind, and require each value's type to be one another
// module can name.
func TestRenderedValuesArePublic(t *testing.T) {
	kinds := map[string]bool{}
	for _, f := range []string{"../examples/budgets.yaml", "../examples/base-policy/budgets.yaml"} {
		bs, err := spec.LoadFile(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := render.Render(bs)
		if err != nil {
			t.Fatalf("render %s: %v", f, err)
		}
		for _, o := range res.Objects {
			kinds[o.Kind] = true
			typ := reflect.TypeOf(o.Object)
			for typ != nil && typ.Kind() == reflect.Pointer {
				typ = typ.Elem()
			}
			if typ == nil {
				t.Errorf("%s: %s %s/%s has no value", f, o.Kind, o.Namespace, o.Name)
			} else if isInternal(typ.PkgPath()) {
				t.Errorf("%s: %s %s/%s is a %s.%s, an internal type", f, o.Kind, o.Namespace, o.Name, typ.PkgPath(), typ.Name())
			}
		}
	}
	for _, k := range []string{"BackendTrafficPolicy", "ClientTrafficPolicy", "ReferenceGrant", render.KindAgentgatewayPolicy, render.KindGatewayConfig} {
		if !kinds[k] {
			t.Errorf("the examples render no %s: the check above did not see one", k)
		}
	}
}

// TestEveryPublicPackageHasAnExample: a package offered to other modules
// shows its use in a runnable Example (with an Output, so go test runs it).
func TestEveryPublicPackageHasAnExample(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{if .GoFiles}}{{.ImportPath}} {{.Dir}}{{end}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	example := regexp.MustCompile(`(?m)^func Example\w*\(\) \{$[\s\S]*?^\s*// Output:`)
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, dir, _ := strings.Cut(line, " ")
		files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			found = found || example.Match(src)
		}
		if !found {
			t.Errorf("%s has no runnable Example (func Example... with // Output:)", path)
		}
		n++
	}
	if n < 5 {
		t.Fatalf("checked %d packages: the listing missed pkg/", n)
	}
}
