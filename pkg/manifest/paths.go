package manifest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/internal/ctxio"
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
	in, err := inputs(paths)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(in))
	for i, f := range in {
		out[i] = f.path
	}
	return out, nil
}

// input is one file to read; walked is true for files found in a directory.
type input struct {
	path   string
	walked bool
}

func inputs(paths []string) ([]input, error) {
	var out []input
	for _, p := range paths {
		if p == Stdin {
			out = append(out, input{path: p})
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil, &Error{File: p, Err: pathErr(err)}
		}
		if !st.IsDir() {
			out = append(out, input{path: p})
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
		for _, f := range found {
			out = append(out, input{path: f, walked: true})
		}
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
	files, err := inputs(paths)
	if err != nil {
		return nil, err
	}
	var objs []*Object
	left := opts.MaxTotalBytes
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		got, n, err := readOne(ctx, f.path, stdin, opts, left, f.walked)
		if err != nil {
			return nil, err
		}
		left -= n
		objs = append(objs, got...)
	}
	return objs, nil
}

// readOne reads one input of at most min(MaxFileBytes, left) bytes and
// returns its objects and size. Opening and reading give up when ctx ends
// (a FIFO without a writer, a stdin that never ends).
func readOne(ctx context.Context, path string, stdin io.Reader, opts Options, left int64, walked bool) ([]*Object, int64, error) {
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
		f, err := ctxio.Open(ctx, path)
		if err != nil {
			if ctx.Err() != nil {
				return nil, 0, err
			}
			return nil, 0, &Error{File: path, Err: pathErr(err)}
		}
		defer func() { _ = f.Close() }() // read-only
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
	data, err := ctxio.ReadAll(ctx, io.LimitReader(r, limit+1))
	if err != nil && ctx.Err() != nil {
		return nil, 0, err
	}
	if err != nil {
		return nil, 0, &Error{File: name, Err: fmt.Errorf("read: %w", err)}
	}
	if int64(len(data)) > limit {
		return nil, 0, tooLarge(name, int64(len(data)))
	}
	objs, err := Parse(name, data, opts)
	if err != nil && walked && opts.SkipForeign != nil && errors.Is(err, ErrNotAnObject) && foreign(data) {
		opts.SkipForeign(name)
		return nil, int64(len(data)), nil
	}
	return objs, int64(len(data)), err
}

// foreign reports whether no document of data is a Kubernetes object (a
// mapping with apiVersion and kind). It is only asked about data that Parse
// read without a YAML or size error.
func foreign(data []byte) bool {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			return errors.Is(err, io.EOF)
		}
		if len(n.Content) == 0 {
			continue
		}
		root := Resolve(n.Content[0])
		if root.Kind == yaml.MappingNode && Str(Get(root, "apiVersion")) != "" && Str(Get(root, "kind")) != "" {
			return false
		}
	}
}
