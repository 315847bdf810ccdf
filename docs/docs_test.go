// Package docs holds the project's documentation; its test renders every
// YAML sample in it, so a sample a reader copies loads and renders.
package docs

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// sample is one ```yaml block of a Markdown file.
type sample struct {
	file string
	line int // of the first YAML line
	text string
}

// yamlSamples returns the ```yaml blocks of the Markdown files given.
func yamlSamples(t *testing.T, files []string) []sample {
	t.Helper()
	var out []sample
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		var cur *sample
		var b strings.Builder
		indent := "" // a block inside a list item is indented with its fence
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			switch {
			case cur == nil && strings.TrimSpace(line) == "```yaml":
				cur = &sample{file: f, line: n + 1}
				indent = line[:len(line)-len(strings.TrimLeft(line, " "))]
				b.Reset()
			case cur != nil && strings.TrimSpace(line) == "```":
				cur.text = b.String()
				out = append(out, *cur)
				cur = nil
			case cur != nil:
				b.WriteString(strings.TrimPrefix(line, indent) + "\n")
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if cur != nil {
			t.Errorf("%s:%d: a yaml block is never closed", f, cur.line)
		}
	}
	return out
}

func markdownFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append(files, "../README.md")
}

// TestYAMLSamples: every YAML sample parses (yaml.v3 refuses a duplicate
// key, as Kubernetes does), and a BudgetSet sample loads and renders, with
// a basePolicy path resolved next to examples/base-policy/budgets.yaml
// (where gateway/agent-router-traffic.yaml lives).
func TestYAMLSamples(t *testing.T) {
	samples := yamlSamples(t, markdownFiles(t))
	budgetSets := 0
	for _, s := range samples {
		dec := yaml.NewDecoder(strings.NewReader(s.text))
		for {
			var doc map[string]any
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Errorf("%s:%d: sample is not valid YAML: %v", s.file, s.line, err)
				break
			}
			if doc["kind"] == spec.Kind {
				budgetSets++
				renderSample(t, s)
			}
		}
	}
	if budgetSets == 0 {
		t.Fatal("no BudgetSet sample found in docs/: the test lost its subject")
	}
}

func renderSample(t *testing.T, s sample) {
	t.Helper()
	path := filepath.Join("..", "examples", "base-policy", "docs-sample.yaml")
	bs, err := spec.Load([]byte(s.text), path)
	if err != nil {
		t.Errorf("%s:%d: the BudgetSet sample does not load: %v", s.file, s.line, err)
		return
	}
	if err := bs.ReadBasePolicies(filepath.Dir(path)); err != nil {
		t.Errorf("%s:%d: %v", s.file, s.line, err)
		return
	}
	if _, err := render.Render(bs); err != nil {
		t.Errorf("%s:%d: the BudgetSet sample does not render: %v", s.file, s.line, err)
	}
}

// foreignPaths are paths the docs cite in other repositories, which share
// a top-level directory name with this one; each names its repository.
var foreignPaths = map[string]string{
	"internal/extproc/":                     "envoyproxy/ai-gateway",
	"internal/extensionserver/":             "envoyproxy/ai-gateway",
	"internal/llmcostcel/":                  "envoyproxy/ai-gateway",
	"internal/translator/":                  "envoyproxy/ai-gateway",
	"internal/gatewayapi":                   "envoyproxy/gateway",
	"internal/xds/translator/":              "envoyproxy/gateway",
	"pkg/openapiclient/":                    "kubernetes-sigs/kubectl-validate",
	"internal/infrastructure/":              "envoyproxy/gateway",
	"examples/traffic-ratelimiting-global/": "agentgateway/agentgateway",
	"pkg/kubelet/":                          "kubernetes/kubernetes",
}

// repoPath matches a path under one of the repository's top-level
// directories (also as a go command's ./pkg/... argument), or a relative
// link climbing to one.
func repoPath(t *testing.T) *regexp.Regexp {
	t.Helper()
	entries, err := os.ReadDir("..")
	if err != nil {
		t.Fatal(err)
	}
	var tops []string
	for _, e := range entries {
		if e.IsDir() && e.Name() != ".git" && e.Name() != ".tools" {
			tops = append(tops, regexp.QuoteMeta(e.Name()))
		}
	}
	return regexp.MustCompile(`(?:^|[^\w./-])(?:\./)?((?:\.\./)*(?:` + strings.Join(tops, "|") + `)/[\w./-]*[\w/])`)
}

// TestRepositoryPathsExist: every repository path the docs, the README and
// the examples' READMEs name exists, so a reader never follows a path to a
// file that moved. A path is looked up from the repository root, from the
// Markdown file's directory and from any directory named before it on the
// same line ("See `examples/gitops/`: its `.github/workflows/...`"); a
// package path may end in an exported name (`internal/ledger.Recorder`).
func TestRepositoryPathsExist(t *testing.T) {
	files := append(markdownFiles(t), globs(t, "../examples/*/README.md", "../examples/*/*/README.md", "../deploy/*/README.md")...)
	re := repoPath(t)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(data), "\n") {
			var bases []string
			for _, m := range re.FindAllStringSubmatch(line, -1) {
				p := m[1]
				if !pathExists(p, f, bases) && !foreign(p) {
					t.Errorf("%s:%d: %s does not exist", f, n+1, p)
				}
				bases = append(bases, p)
			}
		}
	}
}

func globs(t *testing.T, patterns ...string) []string {
	t.Helper()
	var out []string
	for _, p := range patterns {
		m, err := filepath.Glob(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	return out
}

// pathExists looks p up from the root, the Markdown file's directory and
// the directories named before it; a trailing ".Name" may be a Go name.
func pathExists(p, mdFile string, bases []string) bool {
	cands := []string{p}
	if i := strings.LastIndex(p, "."); i > strings.LastIndex(p, "/") && i+1 < len(p) && unicode.IsUpper(rune(p[i+1])) {
		cands = append(cands, p[:i])
	}
	dirs := []string{"..", filepath.Dir(mdFile)}
	for _, b := range bases {
		dirs = append(dirs, filepath.Join("..", b))
	}
	for _, c := range cands {
		for _, d := range dirs {
			if strings.HasPrefix(c, "../") && d == ".." {
				continue // a relative link climbs from the Markdown file
			}
			if _, err := os.Stat(filepath.Join(d, c)); err == nil {
				return true
			}
		}
	}
	return false
}

func foreign(p string) bool {
	for prefix := range foreignPaths {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return false
}
