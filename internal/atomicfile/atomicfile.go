// Package atomicfile writes files so a reader never sees a partial file and a
// failed write leaves nothing behind: data goes to a temporary file in the
// target directory, is synced, then renamed (or linked) into place.
package atomicfile

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
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
	// StaleTempAge is how old a temporary file of ours must be before a
	// later write removes it even though its writer's pid is alive (pids are
	// reused). Default: DefaultStaleTempAge.
	StaleTempAge time.Duration
}

// DefaultStaleTempAge: no write of ours takes anywhere near an hour.
const DefaultStaleTempAge = time.Hour

func (o Options) perm() fs.FileMode {
	if o.Perm == 0 {
		return DefaultPerm
	}
	return o.Perm
}

// writing is a WriteFunc writer of data as it is.
func writing(data []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}
}

// writeTemp writes what write writes (through a buffer) to a synced
// temporary file in dir and returns its path.
func writeTemp(dir string, write func(io.Writer) error, perm fs.FileMode) (string, error) {
	// The writer's pid in the name lets a later run tell debris of a killed
	// writer from a write in progress (CleanStale).
	f, err := os.CreateTemp(dir, tempPrefix+strconv.Itoa(os.Getpid())+"-*")
	if err != nil {
		return "", withoutTempName(err)
	}
	name := f.Name()
	bw := bufio.NewWriterSize(f, 64<<10)
	werr := write(bw)
	if werr == nil {
		werr = bw.Flush()
	}
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
		_ = os.Remove(name) // cleanup of a failed temp file; werr is the error to report
		return "", withoutTempName(werr)
	}
	return name, nil
}

// withoutTempName drops the temporary file's name from an error of the
// operating system: callers name the target ("write DIR/FILE: permission
// denied"), and ".budgetgen-tmp-123-456" is a name the reader never chose.
func withoutTempName(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.HasPrefix(filepath.Base(pe.Path), tempPrefix) {
		return pe.Err
	}
	return err
}

// WriteFile writes data to path atomically: path holds either its old content
// or all of data, never a mix.
func WriteFile(path string, data []byte, opts Options) error {
	return WriteFunc(path, writing(data), opts)
}

// WriteFunc is WriteFile of what write writes, streamed to the temporary
// file (a large file is never held whole in memory). An error from write
// leaves path as it was.
func WriteFunc(path string, write func(io.Writer) error, opts Options) error {
	// Write through a symbolic link to its target: a linked file (a spec
	// shared between repositories, say) stays a link.
	if target, err := filepath.EvalSymlinks(path); err == nil {
		path = target
	}
	dir := filepath.Dir(path)
	CleanStale(dir, opts)
	tmp, err := writeTemp(dir, write, opts.perm())
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if opts.NoOverwrite {
		// link fails if path exists, atomically.
		err = os.Link(tmp, path)
		_ = os.Remove(tmp) // the link (or its failure) is what counts; stale temps are swept
	} else {
		err = os.Rename(tmp, path)
		if err != nil {
			_ = os.Remove(tmp) // cleanup after a failed rename; err is reported
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
func WriteDir(dir string, files map[string][]byte, opts Options) error {
	st, err := StageDir(dir, files, opts)
	if err != nil {
		return err
	}
	return st.Commit()
}

// Staged is a directory write whose contents are on disk, in temporary files
// next to their targets, but not yet in place: Commit puts them in place,
// Abort removes them. Staging several directories before committing any
// writes all of them or none whenever a write fails (a full disk, a
// read-only directory): only a rename can still fail after staging.
type Staged struct {
	dir     string
	names   []string
	temps   map[string]string
	stale   []string
	created bool
}

// StageDir writes files' contents into temporary files in dir (created if
// needed) and lists the stale files per opts.RemoveStale, changing nothing
// a reader sees. On error nothing is left behind.
func StageDir(dir string, files map[string][]byte, opts Options) (_ *Staged, err error) {
	names, err := sortedNames(dir, files)
	if err != nil {
		return nil, err
	}

	st := &Staged{dir: dir, names: names, temps: map[string]string{}}
	if _, statErr := os.Stat(dir); errors.Is(statErr, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
		st.created = true
	} else {
		CleanStale(dir, opts)
	}
	defer func() {
		if err != nil {
			st.Abort()
		}
	}()
	for _, name := range names {
		if info, statErr := os.Lstat(filepath.Join(dir, name)); statErr == nil && info.IsDir() {
			return nil, fmt.Errorf("write %s: %s is a directory", dir, name)
		}
		t, err := writeTemp(dir, writing(files[name]), opts.perm())
		if err != nil {
			return nil, fmt.Errorf("write %s: %w", filepath.Join(dir, name), err)
		}
		st.temps[name] = t
	}

	if st.stale, err = staleFiles(dir, files, opts); err != nil {
		return nil, err
	}
	return st, nil
}

// sortedNames checks that every name in files is a plain file name and
// returns them in order.
func sortedNames(dir string, files map[string][]byte) ([]string, error) {
	names := make([]string, 0, len(files))
	for name := range files {
		if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, tempPrefix) || name == "." || name == ".." {
			return nil, fmt.Errorf("write %s: invalid file name %q", dir, name)
		}
		names = append(names, name)
	}
	slices.Sort(names)
	return names, nil
}

// staleFiles lists, in name order, the regular files in dir that files does
// not hold and opts.RemoveStale would remove. A missing dir has none.
func staleFiles(dir string, files map[string][]byte, opts Options) ([]string, error) {
	if opts.RemoveStale == nil {
		return nil, nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var stale []string
	for _, e := range entries {
		name := e.Name()
		if _, ok := files[name]; ok || !e.Type().IsRegular() || strings.HasPrefix(name, tempPrefix) {
			continue
		}
		content, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, name), err)
		}
		if opts.RemoveStale(name, content) {
			stale = append(stale, name)
		}
	}
	return stale, nil
}

// Commit renames the staged files into place in name order and removes the
// stale files. On error the files not yet renamed are removed. A nil
// *Staged commits nothing.
func (st *Staged) Commit() error {
	if st == nil {
		return nil
	}
	for _, name := range st.names {
		if err := os.Rename(st.temps[name], filepath.Join(st.dir, name)); err != nil {
			st.Abort()
			return fmt.Errorf("write %s: %w", filepath.Join(st.dir, name), err)
		}
		delete(st.temps, name)
	}
	st.created = false
	for _, name := range st.stale {
		if err := os.Remove(filepath.Join(st.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove stale %s: %w", filepath.Join(st.dir, name), err)
		}
	}
	syncDir(st.dir)
	return nil
}

// Abort removes what is still staged (and the directory, if staging created
// it and it is empty). Safe to call after Commit, more than once, and on a
// nil *Staged (nothing staged).
func (st *Staged) Abort() {
	if st == nil {
		return
	}
	for name, t := range st.temps {
		_ = os.Remove(t) // abort is best-effort cleanup; stale temps are swept
		delete(st.temps, name)
	}
	if st.created {
		_ = os.Remove(st.dir) // only succeeds when empty
		st.created = false
	}
}

// syncDir makes renames durable; failures are ignored because not every
// platform or filesystem supports syncing a directory.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()  // see above: not every filesystem syncs a directory
		_ = d.Close() // read-only directory handle
	}
}

// CleanStale removes the temporary files a killed writer left in dir: files
// named with our prefix whose writer pid no longer exists, or that are older
// than opts.StaleTempAge (a reused pid, or a name without a pid). Files of a
// live writer in progress are kept. Errors are ignored: cleaning is a
// courtesy, never a reason for a write to fail.
func CleanStale(dir string, opts Options) {
	age := opts.StaleTempAge
	if age <= 0 {
		age = DefaultStaleTempAge
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, tempPrefix) || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		if time.Since(info.ModTime()) > age || writerGone(name, info.ModTime()) {
			_ = os.Remove(filepath.Join(dir, name)) // sweep of stale temps: best-effort
		}
	}
}

// processStart is when this process started, near enough: a temporary file
// named with this process's pid but last written before it was left by an
// earlier process with the same pid.
var processStart = time.Now()

// writerGone reports whether the pid in a temporary file's name
// (.budgetgen-tmp-<pid>-<random>) names no running process, or names this
// one and the file is older than it: a container's process is pid 1 in
// every incarnation, so the debris of a killed one (a snapshot written as
// the pod was OOM-killed) bears the pid of the next.
func writerGone(name string, modified time.Time) bool {
	pidText, _, ok := strings.Cut(strings.TrimPrefix(name, tempPrefix), "-")
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid <= 0 {
		return false
	}
	if pid == os.Getpid() {
		return modified.Before(processStart)
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
