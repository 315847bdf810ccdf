package atomicfile

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// CompareDir reports what WriteDir would do, by the same stale-file rules,
// and changes nothing: after WriteDir, CompareDir reports nothing.
func TestCompareDir(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"a.yaml":               "same\n",
		"b.yaml":               "old\n",
		"d.yaml":               "# generated\nstale\n",
		"e.yaml":               "hand-written\n",
		tempPrefix + "1-x.txt": "debris",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := listDir(t, dir)
	files := map[string][]byte{"a.yaml": []byte("same\n"), "b.yaml": []byte("new\n"), "c.yaml": []byte("created\n")}
	opts := Options{RemoveStale: func(_ string, content []byte) bool { return strings.HasPrefix(string(content), "# generated") }}
	changes, err := CompareDir(dir, files, opts)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range changes {
		got = append(got, c.Name+":"+string(c.Kind)+":"+string(c.Old)+"->"+string(c.New))
	}
	want := []string{"b.yaml:update:old\n->new\n", "c.yaml:create:->created\n", "d.yaml:remove:# generated\nstale\n->"}
	if !slices.Equal(got, want) {
		t.Fatalf("changes = %q, want %q", got, want)
	}
	if after := listDir(t, dir); !slices.Equal(before, after) {
		t.Fatalf("CompareDir changed the directory: %v -> %v", before, after)
	}
	if err := WriteDir(dir, files, opts); err != nil {
		t.Fatal(err)
	}
	if changes, err := CompareDir(dir, files, opts); err != nil || len(changes) != 0 {
		t.Fatalf("after WriteDir: changes %+v, err %v; want none", changes, err)
	}
}

func TestCompareDirMissingAndInvalid(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "absent")
	changes, err := CompareDir(dir, map[string][]byte{"x": []byte("1")}, Options{RemoveStale: func(string, []byte) bool { return true }})
	if err != nil || len(changes) != 1 || changes[0].Kind != Create {
		t.Fatalf("missing dir: %+v %v, want one create", changes, err)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatal("CompareDir created the directory")
	}
	if _, err := CompareDir(t.TempDir(), map[string][]byte{"../x": nil}, Options{}); err == nil {
		t.Fatal("a name with a path was accepted")
	}
	sub := t.TempDir()
	if err := os.Mkdir(filepath.Join(sub, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := CompareDir(sub, map[string][]byte{"x": nil}, Options{}); err == nil || !strings.Contains(err.Error(), "x") {
		t.Fatalf("a directory where a file goes: err %v", err)
	}
}

// listDir is list with each file's content: name=content.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, name := range list(t, dir) {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		out = append(out, name+"="+string(b))
	}
	return out
}
