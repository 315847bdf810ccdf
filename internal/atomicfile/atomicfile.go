// Package atomicfile writes files so a reader never sees a partial file and a
// failed write leaves nothing behind: data goes to a temporary file in the
// target directory, is synced, then renamed (or linked) into place.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultPerm is the mode of files written when Options.Perm is zero.
const DefaultPerm fs.FileMode = 0o644

// tempPrefix marks temporary files, so a crash leaves recognisable debris.
const tempPrefix = ".budgetgen-tmp-"

// Options tune writes. The zero value is ready to use.
type Options struct {
	// Perm of the written files. Default: DefaultPerm (before umask).
	Perm fs.FileMode
	// NoOverwrite makes WriteFile fail with an error wrapping fs.ErrExist when
	// the target exists, atomically (no check-then-write race).
	NoOverwrite bool
	// RemoveStale, for WriteDir, is asked about each regular file already in the
	// directory that is not being written; returning true removes it once every
	// new file is in place. Nil keeps every existing file.
	RemoveStale func(name string, content []byte) bool
}

func (o Options) perm() fs.FileMode {
	if o.Perm == 0 {
		return DefaultPerm
	}
	return o.Perm
}

// writeTemp writes data to a synced temporary file in dir and returns its path.
func writeTemp(dir string, data []byte, perm fs.FileMode) (string, error) {
	f, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return "", err
	}
	name := f.Name()
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Chmod(perm)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(name)
		return "", werr
	}
	return name, nil
}

// WriteFile writes data to path atomically: path holds either its old content
// or all of data, never a mix.
func WriteFile(path string, data []byte, opts Options) error {
	// Write through a symbolic link to its target: a linked file (a spec
	// shared between repositories, say) stays a link.
	if target, err := filepath.EvalSymlinks(path); err == nil {
		path = target
	}
	dir := filepath.Dir(path)
	tmp, err := writeTemp(dir, data, opts.perm())
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if opts.NoOverwrite {
		// link fails if path exists, atomically.
		err = os.Link(tmp, path)
		os.Remove(tmp)
	} else {
		err = os.Rename(tmp, path)
		if err != nil {
			os.Remove(tmp)
		}
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	syncDir(dir)
	return nil
}

// WriteDir writes every file (name -> content; names are plain file names)
// into dir, creating dir if needed. All contents are written to temporary
// files first; if any of that fails, every temporary file (and dir, if this
// call created it) is removed and dir is as before. Then the files are renamed
// into place in name order, and stale files are removed per opts.RemoveStale.
func WriteDir(dir string, files map[string][]byte, opts Options) (err error) {
	names := make([]string, 0, len(files))
	for name := range files {
		if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, tempPrefix) || name == "." || name == ".." {
			return fmt.Errorf("write %s: invalid file name %q", dir, name)
		}
		names = append(names, name)
	}
	slices.Sort(names)

	created := false
	if _, statErr := os.Stat(dir); errors.Is(statErr, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		created = true
	}
	temps := map[string]string{}
	defer func() {
		if err == nil {
			return
		}
		for _, t := range temps {
			os.Remove(t)
		}
		if created {
			os.Remove(dir) // only succeeds when empty
		}
	}()
	for _, name := range names {
		if info, statErr := os.Lstat(filepath.Join(dir, name)); statErr == nil && info.IsDir() {
			return fmt.Errorf("write %s: %s is a directory", dir, name)
		}
		t, err := writeTemp(dir, files[name], opts.perm())
		if err != nil {
			return fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
		}
		temps[name] = t
	}

	var stale []string
	if opts.RemoveStale != nil {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("list %s: %w", dir, err)
		}
		for _, e := range entries {
			name := e.Name()
			if _, ok := files[name]; ok || !e.Type().IsRegular() || strings.HasPrefix(name, tempPrefix) {
				continue
			}
			content, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				return fmt.Errorf("read %s: %w", filepath.Join(dir, name), err)
			}
			if opts.RemoveStale(name, content) {
				stale = append(stale, name)
			}
		}
	}

	for _, name := range names {
		if err := os.Rename(temps[name], filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
		}
		delete(temps, name)
	}
	for _, name := range stale {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove stale %s: %w", filepath.Join(dir, name), err)
		}
	}
	syncDir(dir)
	return nil
}

// syncDir makes renames durable; failures are ignored because not every
// platform or filesystem supports syncing a directory.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
