package manifest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
)

func TestParseKeepsPositionsAcrossDocuments(t *testing.T) {
	src := `# leading comment
apiVersion: v1
kind: ConfigMap
metadata: {name: a, namespace: ns}
---
---
# empty documents above are skipped
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: BackendTrafficPolicy
metadata:
  name: b
  namespace: ns
spec:
  rateLimit:
    global:
      rules:
        - limit: {requests: 5, unit: Day}
`
	objs, err := Parse("f.yaml", []byte(src), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("got %d objects, want 2", len(objs))
	}
	if objs[0].Line() != 2 || objs[0].String() != "ConfigMap ns/a" {
		t.Errorf("first object: line %d %s", objs[0].Line(), objs[0])
	}
	if objs[1].Line() != 8 || objs[1].Document != 2 || objs[1].Group() != "gateway.envoyproxy.io" {
		t.Errorf("second object: line %d doc %d group %s", objs[1].Line(), objs[1].Document, objs[1].Group())
	}
	rule := Items(Get(objs[1].Node, "spec", "rateLimit", "global", "rules"))[0]
	unit := Get(rule, "limit", "unit")
	if unit.Line != 17 || unit.Column != 38 || Str(unit) != "Day" {
		t.Errorf("unit at %d:%d %q, want 17:38 Day", unit.Line, unit.Column, Str(unit))
	}
}

func TestParseExpandsLists(t *testing.T) {
	src := `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"x"}},{"apiVersion":"v1","kind":"Service","metadata":{"name":"y"}}]}`
	objs, err := Parse("l.json", []byte(src), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 || objs[1].Name != "y" {
		t.Fatalf("got %v", objs)
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, src string
		want      error
		line      int
		contains  string
	}{
		{"not yaml", "apiVersion: v1\nkind: [unclosed\n", ErrInvalidYAML, 0, "f.yaml"},
		{"bad indentation", "a: b\n  c: d\n", ErrInvalidYAML, 2, "f.yaml:2"},
		{"scalar document", "just text\n", ErrNotAnObject, 1, "scalar"},
		{"no kind", "apiVersion: v1\nmetadata: {}\n", ErrNotAnObject, 1, "no apiVersion or kind"},
		{"second document broken", "apiVersion: v1\nkind: A\n---\napiVersion: v1\nkind: B\n  x: y\n", ErrInvalidYAML, 6, "f.yaml:6"},
		{"unknown anchor", "apiVersion: v1\nkind: *nope\n", ErrInvalidYAML, 0, "unknown anchor"},
		{"alias cycle", "apiVersion: v1\nkind: A\nspec: &a [*a]\n", ErrAliasCycle, 1, "refers to itself"},
		{"deep", "apiVersion: v1\nkind: A\nspec: " + strings.Repeat("[", 300) + strings.Repeat("]", 300) + "\n", ErrTooDeep, 1, "nested too deeply"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Parse("f.yaml", []byte(tc.src), Options{})
			if err == nil {
				t.Fatalf("no error, got %d objects", len(objs))
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("error %v, want %v", err, tc.want)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "f.yaml" {
				t.Errorf("error %v does not name the file", err)
			}
			if tc.line != 0 && e.Line != tc.line {
				t.Errorf("line %d, want %d (%v)", e.Line, tc.line, err)
			}
			if !strings.Contains(err.Error(), tc.contains) {
				t.Errorf("error %q does not contain %q", err, tc.contains)
			}
		})
	}
}

// billionLaughs is the classic alias bomb: 9^9 leaves from ~1 KB of YAML.
func billionLaughs() string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lol}\ndata:\n  a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n")
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
		b.WriteString("  " + n + ": &" + n + " [")
		for j := 0; j < 9; j++ {
			if j > 0 {
				b.WriteString(",")
			}
			b.WriteString("*" + prev)
		}
		b.WriteString("]\n")
		prev = n
	}
	return b.String()
}

func TestParseRefusesAliasBomb(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := Parse("bomb.yaml", []byte(billionLaughs()), Options{})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrAliasBomb) {
		t.Fatalf("error %v, want ErrAliasBomb", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 8<<20 {
		t.Errorf("allocated %d bytes refusing a 1 KB bomb", got)
	}
	// Aliases that stay small are fine.
	ok := "apiVersion: v1\nkind: A\nmetadata: {name: x}\nx: &x {a: 1}\ny: *x\n"
	objs, err := Parse("ok.yaml", []byte(ok), Options{})
	if err != nil || len(objs) != 1 {
		t.Fatalf("small aliases refused: %v", err)
	}
	v, err := objs[0].Decode()
	if err != nil || v["y"].(map[string]any)["a"] != 1 {
		t.Fatalf("decode %v %v", v, err)
	}
}

func TestReadRefusesLargeInputWithBoundedMemory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "big.yaml")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("# padding padding padding padding padding padding padding padding\n"), 1<<14)
	for written := 0; written < 50<<20; written += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = ReadPaths(context.Background(), []string{path}, nil, Options{})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "big.yaml") {
		t.Fatalf("error %v, want ErrTooLarge naming the file", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Errorf("allocated %d bytes refusing a 50 MB file by its size", got)
	}
	// The same stream on stdin is cut at the limit, never read whole.
	in, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	runtime.ReadMemStats(&before)
	_, err = ReadPaths(context.Background(), []string{Stdin}, in, Options{MaxFileBytes: 4 << 20})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "<stdin>") {
		t.Fatalf("stdin error %v", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 32<<20 {
		t.Errorf("allocated %d bytes reading a 4 MiB-limited stdin", got)
	}
}

func TestFilesWalksDirectories(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"b.yaml", "a/x.yml", "a/y.json", "a/z.txt", ".github/w.yaml", "c/.hidden/q.yaml"} {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte("apiVersion: v1\nkind: A\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Files([]string{dir, "-"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "a/x.yml"), filepath.Join(dir, "a/y.json"), filepath.Join(dir, "b.yaml"), "-"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("files %v, want %v", got, want)
	}
	_, err = Files([]string{filepath.Join(dir, "missing.yaml")})
	if err == nil || !strings.Contains(err.Error(), "missing.yaml: no such file or directory") {
		t.Errorf("missing path error %v", err)
	}
}

// FuzzRead feeds arbitrary bytes through Read (and so Parse): no panic, every
// error positioned in the file, every object with an identity.
func FuzzRead(f *testing.F) {
	f.Add([]byte("apiVersion: v1\nkind: A\nmetadata: {name: a}\n---\napiVersion: v1\nkind: B\n"))
	f.Add([]byte(billionLaughs()))
	f.Add([]byte("apiVersion: v1\nkind: A\nspec: &a [*a]\n"))
	f.Add([]byte("{\"apiVersion\":\"v1\",\"kind\":\"List\",\"items\":[{\"apiVersion\":\"v1\",\"kind\":\"X\"}]}"))
	f.Add([]byte("a: b\n  c: d\n"))
	f.Add([]byte("- [\n"))
	f.Add([]byte("apiVersion: v1\nkind: A\n<<: {x: 1}\n"))
	f.Add([]byte("domain: agents/x\ndescriptors:\n  - key: budget\n    value: per-run\n    descriptors: [{key: principal, rate_limit: {unit: DAY, requests_per_unit: 1}, shadow_mode: true}]\n"))
	f.Add([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  a.yaml: |\n    domain: d\n    descriptors:\n      - key: budget\n  b: \"domain: e\\ndescriptors: []\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := Read("fuzz.yaml", bytes.NewReader(data), Options{MaxNodes: 10_000, MaxFileBytes: 1 << 20})
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.File != "fuzz.yaml" {
				t.Fatalf("error without position: %v", err)
			}
			return
		}
		for _, o := range objs {
			// A Kubernetes object has apiVersion and kind; a rate limit
			// service config document has no apiVersion and is named by
			// its domain.
			if o.Kind == "" || o.Node == nil || (o.APIVersion == "" && (!o.IsRateLimitConfig() || o.Name == "")) {
				t.Fatalf("object without identity: %+v", o)
			}
			if _, err := o.Decode(); err != nil {
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("decode error without position: %v", err)
				}
			}
		}
	})
}

func TestReadPathsBoundsTotalSize(t *testing.T) {
	dir := t.TempDir()
	doc := []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: \"" + strings.Repeat("x", 1000) + "\"}\n")
	for i := 0; i < 5; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d.yaml", i)), doc, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	objs, err := ReadPaths(context.Background(), []string{dir}, nil, Options{MaxTotalBytes: int64(5 * len(doc))})
	if err != nil || len(objs) != 5 {
		t.Fatalf("within the total: %d objects, %v", len(objs), err)
	}
	_, err = ReadPaths(context.Background(), []string{dir}, nil, Options{MaxTotalBytes: int64(4*len(doc) + 10)})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "f4.yaml") || !strings.Contains(err.Error(), "inputs together exceed") {
		t.Errorf("over the total: %v", err)
	}
}

func TestSkipForeignFilesInWalks(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("app/policy.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
	values := write("app/values.yaml", "replicaCount: 2\nimage: {tag: v1}\n")
	write(".pre-commit-config.yaml", "repos:\n  - repo: local\n    hooks: []\n")
	write("list.yml", "- a\n- b\n---\n# only a comment\n")
	var skipped []string
	opts := Options{SkipForeign: func(f string) { skipped = append(skipped, f) }}
	objs, err := ReadPaths(context.Background(), []string{dir}, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || objs[0].Kind != "ConfigMap" {
		t.Fatalf("objects %v", objs)
	}
	want := []string{filepath.Join(dir, ".pre-commit-config.yaml"), values, filepath.Join(dir, "list.yml")}
	sort.Strings(want)
	sort.Strings(skipped)
	if strings.Join(skipped, ",") != strings.Join(want, ",") {
		t.Fatalf("skipped %v, want %v", skipped, want)
	}
	// Without SkipForeign, or for a file named directly, it is an error.
	if _, err := ReadPaths(context.Background(), []string{dir}, nil, Options{}); !errors.Is(err, ErrNotAnObject) {
		t.Fatalf("no SkipForeign: err = %v", err)
	}
	if _, err := ReadPaths(context.Background(), []string{values}, nil, opts); !errors.Is(err, ErrNotAnObject) {
		t.Fatalf("named file: err = %v", err)
	}
	// A file mixing an object with another document is a mistake, not a
	// foreign file.
	write("app/mixed.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n---\nreplicaCount: 2\n")
	if _, err := ReadPaths(context.Background(), []string{dir}, nil, opts); !errors.Is(err, ErrNotAnObject) || !strings.Contains(err.Error(), "mixed.yaml:5") {
		t.Fatalf("mixed file: err = %v", err)
	}
}

// The rate limit service's own config files (domain + descriptors, no
// apiVersion or kind) are read as RateLimitConfig documents, since the gate
// checks agentgateway's modes there; anything short of that shape is still
// not an object.
func TestRateLimitConfigDocuments(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		ok        bool
	}{
		{"rls config", "domain: agents/x\ndescriptors:\n  - key: budget\n    value: per-run\n", true},
		{"empty descriptors", "domain: agents/x\ndescriptors: []\n", true},
		{"no descriptors", "domain: agents/x\n", false},
		{"descriptors not a list", "domain: agents/x\ndescriptors: {key: a}\n", false},
		{"empty domain", "domain: \"\"\ndescriptors: []\n", false},
		{"domain not a scalar", "domain: [a]\ndescriptors: []\n", false},
		{"kind without apiVersion", "kind: X\ndomain: a\ndescriptors: []\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Parse("rls.yaml", []byte(tc.doc), Options{})
			if !tc.ok {
				if !errors.Is(err, ErrNotAnObject) {
					t.Fatalf("err %v, want ErrNotAnObject", err)
				}
				return
			}
			if err != nil || len(objs) != 1 || !objs[0].IsRateLimitConfig() || objs[0].Name != "agents/x" || objs[0].APIVersion != "" || objs[0].Line() != 1 {
				t.Fatalf("objs %+v err %v", objs, err)
			}
		})
	}
}

// A rate limit config inside a ConfigMap's data (what kustomize's
// configMapGenerator applies) is read as a RateLimitConfig positioned in
// the file: line for line in a literal block, at the value otherwise. Other
// data, valid YAML or not, is not.
func TestConfigMapRateLimitConfigs(t *testing.T) {
	src := `apiVersion: v1
kind: ConfigMap
metadata:
  name: rls
  namespace: envoy-gateway-system
data:
  agents.yaml: |

    domain: agents/x
    descriptors:
      - key: budget
        value: per-run
  quoted.yaml: "domain: agents/y\ndescriptors: []\n"
  other.yaml: |
    descriptors: not a config
  broken.yaml: "descriptors: [\n"
  settings: "LOG_LEVEL=debug"
`
	objs, err := Parse("cm.yaml", []byte(src), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		if o.IsRateLimitConfig() {
			d, v := Get(o.Node, "domain"), Get(o.Node, "domain")
			if ds := Items(Get(o.Node, "descriptors")); len(ds) > 0 {
				v = Get(ds[0], "value")
			}
			got = append(got, fmt.Sprintf("%s domain@%d:%d value@%d:%d %s", o.Name, d.Line, d.Column, v.Line, v.Column, o))
		}
	}
	want := []string{
		"agents/x domain@9:13 value@12:16 RateLimitConfig agents/x in ConfigMap envoy-gateway-system/rls data[agents.yaml]",
		"agents/y domain@13:16 value@13:16 RateLimitConfig agents/y in ConfigMap envoy-gateway-system/rls data[quoted.yaml]",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") || len(objs) != 3 {
		t.Fatalf("got %d objects, rate limit configs:\n%s\nwant:\n%s", len(objs), strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The positions are the file's: line 12 column 16 is per-run.
	line := strings.Split(src, "\n")[11]
	if !strings.HasPrefix(line[15:], "per-run") {
		t.Fatalf("line 12 col 16 is %q", line[15:])
	}
}
