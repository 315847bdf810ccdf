package manifest

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Stdin is the path that means "read standard input".
const Stdin = "-"

// IsManifestFile reports whether a directory walk picks up path.
func IsManifestFile(path string) bool {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// Files expands paths into the list of files to read: files as given,
// directories walked recursively for .yaml/.yml/.json files (hidden
// directories such as .git and .github are skipped below the given root),
// "-" kept for stdin. The result keeps argument order, each directory's
// files sorted, so runs are reproducible.
func Files(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		if p == Stdin {
			out = append(out, p)
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil, &Error{File: p, Err: pathErr(err)}
		}
		if !st.IsDir() {
			out = append(out, p)
			continue
		}
		var found []string
		err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return &Error{File: path, Err: pathErr(err)}
			}
			if d.IsDir() {
				if path != p && strings.HasPrefix(d.Name(), ".") {
					return filepath.SkipDir
				}
				return nil
			}
			if IsManifestFile(path) {
				found = append(found, path)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		sort.Strings(found)
		out = append(out, found...)
	}
	return out, nil
}

func pathErr(err error) error {
	if pe, ok := err.(*fs.PathError); ok {
		return pe.Err
	}
	return err
}

// ReadPaths reads every object from paths (see Files). stdin is read for "-".
// A file larger than the limit is refused from its size, before reading.
func ReadPaths(ctx context.Context, paths []string, stdin io.Reader, opts Options) ([]*Object, error) {
	opts = opts.withDefaults()
	files, err := Files(paths)
	if err != nil {
		return nil, err
	}
	var objs []*Object
	left := opts.MaxTotalBytes
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		got, n, err := readOne(f, stdin, opts, left)
		if err != nil {
			return nil, err
		}
		left -= n
		objs = append(objs, got...)
	}
	return objs, nil
}

// readOne reads one input of at most min(MaxFileBytes, left) bytes and
// returns its objects and size.
func readOne(path string, stdin io.Reader, opts Options, left int64) ([]*Object, int64, error) {
	limit := min(opts.MaxFileBytes, left)
	tooLarge := func(name string, size int64) error {
		if left < opts.MaxFileBytes && size > left {
			return &Error{File: name, Err: fmt.Errorf("%w: the inputs together exceed %d bytes", ErrTooLarge, opts.MaxTotalBytes)}
		}
		return &Error{File: name, Err: fmt.Errorf("%w: %d bytes, limit %d (raise --max-file-size to read it)", ErrTooLarge, size, opts.MaxFileBytes)}
	}
	var (
		r    io.Reader
		name = path
	)
	if path == Stdin {
		if stdin == nil {
			return nil, 0, &Error{File: "<stdin>", Err: fmt.Errorf("no standard input")}
		}
		r, name = stdin, "<stdin>"
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, 0, &Error{File: path, Err: pathErr(err)}
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return nil, 0, &Error{File: path, Err: pathErr(err)}
		}
		if st.IsDir() {
			return nil, 0, &Error{File: path, Err: fmt.Errorf("is a directory")}
		}
		if st.Size() > limit {
			return nil, 0, tooLarge(path, st.Size())
		}
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, 0, &Error{File: name, Err: fmt.Errorf("read: %w", err)}
	}
	if int64(len(data)) > limit {
		return nil, 0, tooLarge(name, int64(len(data)))
	}
	objs, err := Parse(name, data, opts)
	return objs, int64(len(data)), err
}
