package cli

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/pgtest"
)

// exampleSpecs are the spec files shipped in the repository, each with the
// directory it needs (a basePolicy is relative to the spec).
var exampleSpecs = []string{
	"examples/budgets.yaml",
	"examples/base-policy/budgets.yaml",
	"examples/gitops/budgets/budgets.yaml",
	"templates/minimal.yaml",
	"templates/ai-gateway.yaml",
	"deploy/report/budgets.yaml",
}

// specCommands runs each command that takes --spec on a spec copied to a
// temporary directory, with whatever else the command needs.
var specCommands = map[string]func(t *testing.T, spec string, r *specResources) []string{
	"ledger sync": func(_ *testing.T, spec string, r *specResources) []string {
		return []string{"ledger", "sync", "--service", r.ledgerURL, "--postgres", r.postgres(), "--spec", spec}
	},
	"export": func(_ *testing.T, spec string, r *specResources) []string {
		return []string{"export", "--service", r.ledgerURL, "--spec", spec}
	},
	"report": func(_ *testing.T, spec string, r *specResources) []string {
		return []string{"report", "--service", r.ledgerURL, "--spec", spec}
	},
	"promote": func(_ *testing.T, spec string, _ *specResources) []string {
		return []string{"promote", "no-such-budget", "--spec", spec}
	},
	"demote": func(_ *testing.T, spec string, _ *specResources) []string {
		return []string{"demote", "no-such-budget", "--spec", spec}
	},
	"assert": func(t *testing.T, spec string, _ *specResources) []string {
		dir := filepath.Join(t.TempDir(), "rendered")
		if code, _, stderr := runCLI(t, "render", spec, "-o", dir); code != ExitOK {
			t.Fatalf("render %s: %d %s", spec, code, stderr)
		}
		return []string{"assert", "--spec", spec, dir}
	},
}

// TestEverySpecFlagLoadsLikeRender: every command with a --spec flag loads
// the spec the way render does (base policies read next to it), on every
// example spec; none fails with render's "was not read" internal message.
// A new command with --spec must be added to specCommands.
func TestEverySpecFlagLoadsLikeRender(t *testing.T) {
	var withSpec []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Flags().Lookup("spec") != nil {
			withSpec = append(withSpec, strings.TrimPrefix(c.CommandPath(), "budgetgen "))
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newRootCmd(&env{}))
	slices.Sort(withSpec)
	for _, name := range withSpec {
		if specCommands[name] == nil {
			t.Errorf("command %q takes --spec but is not tested here", name)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/ledger/", ledger.Handler(ledger.NewMemory("", nil)))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	res := &specResources{t: t, ledgerURL: srv.URL}
	for _, rel := range exampleSpecs {
		for _, name := range withSpec {
			t.Run(rel+"/"+name, func(t *testing.T) {
				spec := copySpecDir(t, rel)
				code, stdout, stderr := runCLI(t, specCommands[name](t, spec, res)...)
				if strings.Contains(stderr, "was not read") || strings.Contains(stderr, "ReadBasePolicies") {
					t.Fatalf("%s did not load %s as render does: %s", name, rel, stderr)
				}
				// The spec loaded: report runs, promote and demote look the
				// budget up, assert checks (its findings are on stdout).
				loaded := code == ExitOK || strings.Contains(stderr, `unknown budget "no-such-budget"`) ||
					name == "assert" && code == ExitFailure && strings.Contains(stdout, "BG")
				if !loaded {
					t.Fatalf("%s on %s: exit %d: %s%s", name, rel, code, stdout, stderr)
				}
			})
		}
	}
	// A missing base policy is the spec's error, with its line, for every command.
	spec := copySpecDir(t, "examples/base-policy/budgets.yaml")
	if err := os.RemoveAll(filepath.Join(filepath.Dir(spec), "gateway-team")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"report", "promote", "demote", "ledger sync", "export"} {
		code, _, stderr := runCLI(t, specCommands[name](t, spec, res)...)
		if code != ExitFailure || !strings.Contains(stderr, "basePolicy: read base policy") {
			t.Errorf("%s without the base policy file: exit %d: %s", name, code, stderr)
		}
	}
}

// specResources are the servers the commands read from or write to: an
// empty ledger on a debug port, and one PostgreSQL started on first use.
type specResources struct {
	t         *testing.T // the test owning the servers
	ledgerURL string
	once      sync.Once
	dsn       string
}

func (r *specResources) postgres() string {
	r.once.Do(func() { r.dsn = pgtest.Start(r.t).DSN })
	return r.dsn
}

// copySpecDir copies the directory of the repository-relative spec rel into
// a temporary directory and returns the copy of the spec.
func copySpecDir(t *testing.T, rel string) string {
	t.Helper()
	src := filepath.Join("..", "..", filepath.Dir(rel))
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, r), 0o755)
		}
		if !strings.HasSuffix(p, ".yaml") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, r), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dst, filepath.Base(rel))
}
