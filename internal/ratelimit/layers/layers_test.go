package layers

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

const mod = "github.com/budgetgen/budgetgen/"

// pkgs lists the packages of internal/ratelimit and internal/store with
// their direct imports and all their dependencies (go list; tests excluded).
func pkgs(t *testing.T) map[string]struct{ imports, deps []string } {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{join .Imports \" \"}}|{{join .Deps \" \"}}",
		mod+"internal/ratelimit/...", mod+"internal/store/...").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	m := map[string]struct{ imports, deps []string }{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.Split(line, "|")
		if len(parts) != 3 {
			t.Fatalf("go list line %q", line)
		}
		m[strings.TrimPrefix(parts[0], mod)] = struct{ imports, deps []string }{local(parts[1]), local(parts[2])}
	}
	return m
}

// local keeps this module's packages, without the module path.
func local(list string) []string {
	var out []string
	for _, p := range strings.Fields(list) {
		if rest, ok := strings.CutPrefix(p, mod); ok {
			out = append(out, rest)
		}
	}
	return out
}

// under reports whether p is pkg or a package under it.
func under(p, pkg string) bool { return p == pkg || strings.HasPrefix(p, pkg+"/") }

// TestImportsPointDown: no lower package depends on one above it. deps
// rules hold for every dependency (transitive); imports rules for the
// package's own imports, where a lower package it uses may legitimately
// depend on more (the engine composes observers, which use the ledger).
func TestImportsPointDown(t *testing.T) {
	const (
		engine   = "internal/ratelimit/engine"
		charge   = "internal/ratelimit/charge"
		observe  = "internal/ratelimit/observe"
		service  = "internal/ratelimit/service"
		server   = "internal/ratelimit/server"
		settings = "internal/ratelimit/settings"
		metrics  = "internal/ratelimit/metrics"
		memory   = "internal/store/memory"
		valkey   = "internal/store/valkey"
		store    = "internal/store"
		ledger   = "internal/ledger"
		thresh   = "internal/thresholds"
	)
	rules := []struct {
		pkg       string
		transitiv bool
		forbidden []string
		why       string
	}{
		{settings, true, []string{engine, charge, observe, service, server, metrics, store, ledger, thresh},
			"settings are plain values; the service turns them into components"},
		{"internal/ratelimit/decide", true, []string{engine, charge, observe, metrics, store, ledger, thresh, server},
			"decide is pure: no store, no metric, no observer"},
		{charge, true, []string{engine, observe, metrics, ledger, thresh, memory, valkey, settings, service, server},
			"charge depends only on the store interface"},
		{observe, true, []string{engine, charge, memory, valkey, settings, service, server},
			"observers are told outcomes; they never reach into the decision or a store adapter"},
		{engine, false, []string{ledger, thresh, metrics, memory, valkey, settings, service, server},
			"the engine composes decide, charge and the observers it is given"},
		{engine, true, []string{memory, valkey, settings, service, server},
			"the engine is given a store and observers; it builds none"},
		{store, true, []string{"internal/ratelimit", ledger},
			"the store interface sits below the decision"},
		{memory, true, []string{"internal/ratelimit", ledger},
			"a store adapter sits below the decision"},
		{valkey, true, []string{"internal/ratelimit", ledger},
			"a store adapter sits below the decision"},
		{"internal/store/storetest", true, []string{"internal/ratelimit", memory, valkey},
			"the store suite tests any store, below the decision"},
		{"internal/store/storetest/windowtest", true, []string{engine, observe, service, server, settings, memory, valkey},
			"the window suite drives decide and charge, not the engine a store sits below"},
	}
	all := pkgs(t)
	for _, r := range rules {
		p, ok := all[r.pkg]
		if !ok {
			t.Errorf("%s: no such package (update the rule)", r.pkg)
			continue
		}
		list, kind := p.imports, "imports"
		if r.transitiv {
			list, kind = p.deps, "depends on"
		}
		for _, dep := range list {
			for _, f := range r.forbidden {
				if under(dep, f) {
					t.Errorf("%s %s %s: %s", r.pkg, kind, dep, r.why)
				}
			}
		}
	}
}

// maxLines is the longest a function may be (docs/architecture.md).
const maxLines = 80

// TestNoLongFunction: no function (declared or literal) of the module's
// non-test files is over maxLines lines, counted from its func keyword to
// its closing brace. Generated code, test data and the pinned tools'
// module are not the module's own.
func TestNoLongFunction(t *testing.T) {
	var long []string
	files := 0
	for _, root := range []string{filepath.Join("..", "..", "..")} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules" || filepath.ToSlash(path) == "../../../hack/tools") {
				return filepath.SkipDir
			}
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			files++
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				name := ""
				switch fn := n.(type) {
				case *ast.FuncDecl:
					if fn.Body == nil {
						return true
					}
					name = fn.Name.Name
				case *ast.FuncLit:
					name = "func literal"
				default:
					return true
				}
				start, end := fset.Position(n.Pos()), fset.Position(n.End())
				if lines := end.Line - start.Line + 1; lines > maxLines {
					long = append(long, fmt.Sprintf("%s:%d: %s is %d lines", filepath.ToSlash(path), start.Line, name, lines))
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files < 200 {
		t.Fatalf("scanned %d files: the walk missed the packages", files)
	}
	sort.Strings(long)
	for _, l := range long {
		t.Errorf("%s (over %d: split where the data flow splits)", l, maxLines)
	}
}
