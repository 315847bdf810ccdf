package atomicfile

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func list(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	if err := WriteFile(p, []byte("one"), Options{}); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("two"), Options{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "two" {
		t.Errorf("content = %q", b)
	}
	err := WriteFile(p, []byte("three"), Options{NoOverwrite: true})
	if !errors.Is(err, fs.ErrExist) {
		t.Errorf("NoOverwrite on existing file: err = %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "two" {
		t.Errorf("content after refused overwrite = %q", b)
	}
	if got := list(t, dir); !slices.Equal(got, []string{"a.yaml"}) {
		t.Errorf("dir holds %v (temp files left behind?)", got)
	}
	if err := WriteFile(filepath.Join(dir, "missing", "b.yaml"), []byte("x"), Options{}); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}

// TestWriteFunc: what write streams lands whole (past the buffer's size),
// with the asked mode; a write that fails part-way leaves the old content
// and no temporary file.
func TestWriteFunc(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state")
	big := strings.Repeat("0123456789", 20_000)
	err := WriteFunc(p, func(w io.Writer) error {
		for i := 0; i < len(big); i += 7 {
			if _, err := io.WriteString(w, big[i:min(i+7, len(big))]); err != nil {
				return err
			}
		}
		return nil
	}, Options{Perm: 0o600})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != big {
		t.Fatalf("content: %d bytes, want %d", len(b), len(big))
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v, %v", fi, err)
	}
	boom := errors.New("encoder failed")
	err = WriteFunc(p, func(w io.Writer) error {
		_, _ = io.WriteString(w, strings.Repeat("x", 100_000))
		return boom
	}, Options{Perm: 0o600})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the writer's", err)
	}
	if b, _ := os.ReadFile(p); string(b) != big {
		t.Fatal("a failed write changed the file")
	}
	if got := list(t, dir); !slices.Equal(got, []string{"state"}) {
		t.Errorf("dir holds %v (temp files left behind?)", got)
	}
}

func TestWriteDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	files := map[string][]byte{"a.yaml": []byte("gen a"), "b.yaml": []byte("gen b")}
	if err := WriteDir(dir, files, Options{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "old.yaml"), []byte("gen old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "mine.txt"), []byte("user file"), 0o644); err != nil {
		t.Fatal(err)
	}
	stale := func(_ string, content []byte) bool { return strings.HasPrefix(string(content), "gen ") }
	if err := WriteDir(dir, map[string][]byte{"a.yaml": []byte("gen a2")}, Options{RemoveStale: stale}); err != nil {
		t.Fatal(err)
	}
	if got := list(t, dir); !slices.Equal(got, []string{"a.yaml", "mine.txt"}) {
		t.Errorf("dir holds %v, want a.yaml and the user's file", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a.yaml")); string(b) != "gen a2" {
		t.Errorf("a.yaml = %q", b)
	}
}

func TestWriteDirAllOrNothing(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "out")
	// A directory where a file should go makes the write fail after other
	// temporary files were written: nothing may be left, not even dir.
	files := map[string][]byte{"a.yaml": []byte("a"), "b": []byte("b"), "c.yaml": []byte("c")}
	if err := os.MkdirAll(filepath.Join(dir, "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteDir(dir, files, Options{}); err == nil {
		t.Fatal("write over a directory succeeded")
	}
	if got := list(t, dir); !slices.Equal(got, []string{"b"}) {
		t.Errorf("failed write left %v", got)
	}

	if err := WriteDir(filepath.Join(root, "x"), map[string][]byte{"../escape": nil}, Options{}); err == nil {
		t.Error("path traversal accepted")
	}
	if _, err := os.Stat(filepath.Join(root, "x")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("rejected write created its directory: %v", err)
	}

	if runtime.GOOS != "windows" && os.Getuid() != 0 {
		ro := filepath.Join(root, "ro")
		os.Mkdir(ro, 0o555)
		if err := WriteDir(ro, map[string][]byte{"a": []byte("a")}, Options{}); err == nil {
			t.Error("write into read-only dir succeeded")
		}
	}
}

func TestWriteFileThroughSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "real.yaml")
	if err := os.WriteFile(target, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.yaml")
	if err := os.Symlink("real.yaml", link); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(link, []byte("new"), Options{}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("link replaced by a file: %v", err)
	}
	if b, _ := os.ReadFile(target); string(b) != "new" {
		t.Fatalf("target = %q", b)
	}
	// NoOverwrite sees through the link too: the target exists.
	if err := WriteFile(link, []byte("x"), Options{NoOverwrite: true}); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("NoOverwrite through a link: %v", err)
	}
}

// TestErrorsNameTheTarget: a write that fails before its rename (a missing
// or read-only directory, a full disk) names the file asked for, not the
// temporary file next to it.
func TestErrorsNameTheTarget(t *testing.T) {
	target := filepath.Join(t.TempDir(), "missing", "budgets.yaml")
	err := WriteFile(target, []byte("x"), Options{})
	if err == nil {
		t.Fatal("WriteFile into a missing directory succeeded")
	}
	if !strings.Contains(err.Error(), target) || strings.Contains(err.Error(), tempPrefix) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("error %q: want %s and ErrNotExist, without the temporary name", err, target)
	}
}
