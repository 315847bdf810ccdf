package settings

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/settings.md from the settings table")

// TestSettingsDoc: docs/settings.md is what the table says; -update
// rewrites it.
func TestSettingsDoc(t *testing.T) {
	var b bytes.Buffer
	if err := WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", "..", "docs", "settings.md")
	if *update {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, b.Bytes()) {
		t.Fatalf("docs/settings.md differs from the settings table; run go test ./internal/ratelimit/settings -run TestSettingsDoc -update")
	}
	for _, d := range Docs() {
		for _, e := range d.Env {
			if !bytes.Contains(got, []byte("`"+e+"`")) {
				t.Errorf("docs/settings.md lacks %s", e)
			}
		}
	}
}

// TestEverySettingHasAGroup: no setting falls into the catch-all group, and
// every group lists something (a group naming only removed settings would
// print an empty heading... or nothing, silently).
func TestEverySettingHasAGroup(t *testing.T) {
	used := map[string]bool{}
	for _, d := range Docs() {
		if d.Group == otherGroup {
			t.Errorf("%v belongs to no group: add it to groups in doc.go", d.Env)
		}
		used[d.Group] = true
		if strings.Contains(d.Doc, "\n") {
			t.Errorf("%v: the description is not one line", d.Env)
		}
	}
	for _, g := range groups {
		if !used[g.title] {
			t.Errorf("group %q has no setting", g.title)
		}
		for _, n := range g.names {
			found := false
			for _, d := range Docs() {
				found = found || (len(d.Env) > 0 && d.Env[0] == n)
			}
			if !found {
				t.Errorf("group %q names %s, which the table does not have", g.title, n)
			}
		}
	}
}

// TestHelpListsEverySettingWithItsDefault: --help shows each setting's
// environment variables, flag and default in its group, and each printed
// default is the real one: setting the variable to it changes nothing.
func TestHelpListsEverySettingWithItsDefault(t *testing.T) {
	var help bytes.Buffer
	if _, err := Load([]string{"--help"}, envOf(nil), &help); err != flag.ErrHelp {
		t.Fatalf("--help: %v", err)
	}
	out := help.String()
	base, err := Load(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range Docs() {
		head := strings.Join(d.Env, ", ")
		if d.Flag != "" {
			head = strings.TrimPrefix(head+", --"+d.Flag, ", ")
		}
		line := "  " + head + " (default " + quoteEmpty(d.Default) + ")\n"
		i := strings.Index(out, line)
		if i < 0 {
			t.Errorf("--help lacks %q", line)
			continue
		}
		if g := strings.LastIndex(out[:i], "\n"+d.Group+":\n"); g < 0 {
			t.Errorf("%s is not under %q", head, d.Group)
		}
		if len(d.Env) == 0 || d.Default == "" {
			continue
		}
		s, err := Load(nil, envOf(map[string]string{d.Env[0]: d.Default}), io.Discard)
		if err != nil {
			t.Errorf("%s=%s (the printed default): %v", d.Env[0], d.Default, err)
			continue
		}
		if !reflect.DeepEqual(s, base) {
			t.Errorf("%s=%s (the printed default) is not the default", d.Env[0], d.Default)
		}
	}
	for _, a := range Accepted() {
		if !strings.Contains(out, "\n  "+a[0]+"\n") {
			t.Errorf("--help lacks %s", a[0])
		}
	}
}

// TestHelpDefaultsAreNotTheEnvironment: --help prints the defaults, not the
// values the environment happens to set.
func TestHelpDefaultsAreNotTheEnvironment(t *testing.T) {
	var help bytes.Buffer
	_, _ = Load([]string{"--help"}, envOf(map[string]string{"GRPC_PORT": "9999"}), &help)
	if !strings.Contains(help.String(), "GRPC_PORT, --grpc-port (default 8081)") {
		t.Fatalf("help:\n%s", help.String())
	}
}

// TestSettingsDocLinksResolve: every relative link of the generated
// docs/settings.md names a file next to it (the doc is generated, so a
// stale link would come back with every -update).
func TestSettingsDocLinksResolve(t *testing.T) {
	var b bytes.Buffer
	if err := WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	docs := filepath.Join("..", "..", "..", "docs")
	for _, m := range regexp.MustCompile(`\]\(([^)#\s]+)(#[^)\s]*)?\)`).FindAllStringSubmatch(b.String(), -1) {
		if strings.Contains(m[1], "://") {
			continue
		}
		if _, err := os.Stat(filepath.Join(docs, m[1])); err != nil {
			t.Errorf("docs/settings.md links to %s, which does not exist", m[1])
		}
	}
}
