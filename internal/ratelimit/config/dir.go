package config

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// DirOptions locate config files the way the reference's runtime loader does:
// every regular file under Root/Subdirectory/AppDirectory, recursively.
type DirOptions struct {
	// Root is RUNTIME_ROOT (reference default /srv/runtime_data/current).
	Root string
	// Subdirectory is RUNTIME_SUBDIRECTORY (default empty).
	Subdirectory string
	// AppDirectory is RUNTIME_APPDIRECTORY (default "config").
	AppDirectory string
	// IgnoreDotFiles skips files and directories whose name starts with '.'
	// (RUNTIME_IGNOREDOTFILES; needed for Kubernetes ConfigMap mounts).
	IgnoreDotFiles bool
}

// Dir returns the directory the files are read from.
func (o DirOptions) Dir() string {
	return filepath.Join(o.Root, o.Subdirectory, o.AppDirectory)
}

// ReadDir reads the config files, sorted by path. Names are relative to Dir()
// with '/' kept. Directories reached through symlinks are not followed, like
// the reference's filepath.Walk.
func ReadDir(o DirOptions) ([]File, error) {
	dir := o.Dir()
	var files []File
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("read config dir %s: %w", dir, err)
		}
		if path == dir {
			return nil
		}
		dot := strings.HasPrefix(d.Name(), ".")
		if d.IsDir() {
			if o.IgnoreDotFiles && dot {
				return filepath.SkipDir
			}
			return nil
		}
		if o.IgnoreDotFiles && dot {
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			st, err := os.Stat(path)
			if err != nil || st.IsDir() {
				return nil // dangling link or linked directory: skipped like the reference
			}
		} else if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read config file %s: %w", path, err)
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			rel = path
		}
		files = append(files, File{Name: filepath.ToSlash(rel), Data: data})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	return files, nil
}

// LoadDir reads and builds the config in a runtime directory.
func LoadDir(o DirOptions) (*Config, error) {
	files, err := ReadDir(o)
	if err != nil {
		return nil, err
	}
	c, err := Load(files)
	if err != nil {
		return nil, fmt.Errorf("load config dir %s: %w", o.Dir(), err)
	}
	return c, nil
}
