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
	"strings"
	"testing"

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
