package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ChangeKind says what WriteDir would do to one file.
type ChangeKind string

const (
	Create ChangeKind = "create" // the file does not exist yet
	Update ChangeKind = "update" // the file exists with other content
	Remove ChangeKind = "remove" // a stale file (Options.RemoveStale) would be removed
)

// Change is one file WriteDir would create, update or remove.
type Change struct {
	Name string // file name in the directory
	Kind ChangeKind
	Old  []byte // the content on disk (Update, Remove)
	New  []byte // the content WriteDir would write (Create, Update)
}

// CompareDir reports, in file name order, what WriteDir(dir, files, opts) would
// change, reading dir and writing nothing: the files it would create or
// whose content differs, and the stale files it would remove (the same
// opts.RemoveStale rules). An empty result means dir is up to date.
func CompareDir(dir string, files map[string][]byte, opts Options) ([]Change, error) {
	names, err := sortedNames(dir, files)
	if err != nil {
		return nil, err
	}
	var changes []Change
	for _, name := range names {
		path := filepath.Join(dir, name)
		old, err := os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			changes = append(changes, Change{Name: name, Kind: Create, New: files[name]})
		case err != nil:
			return nil, fmt.Errorf("read %s: %w", path, err)
		case !bytes.Equal(old, files[name]):
			changes = append(changes, Change{Name: name, Kind: Update, Old: old, New: files[name]})
		}
	}
	stale, err := staleFiles(dir, files, opts)
	if err != nil {
		return nil, err
	}
	for _, name := range stale {
		old, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, name), err)
		}
		changes = append(changes, Change{Name: name, Kind: Remove, Old: old})
	}
	slices.SortFunc(changes, func(a, b Change) int { return strings.Compare(a.Name, b.Name) })
	return changes, nil
}
