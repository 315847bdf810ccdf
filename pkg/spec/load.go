package spec

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// MaxFileBytes is the largest spec (or basePolicy) file read: 32 MiB, as
// budgetgen assert's default --max-file-size. A BudgetSet at Envoy Gateway's
// limits is far smaller; a larger file is the wrong file (a log, an image),
// which would otherwise be read whole into memory before its first error.
const MaxFileBytes = 32 << 20

// ErrTooLarge is the error (wrapped) for an input above MaxFileBytes.
var ErrTooLarge = errors.New("file too large")

// ReadAll reads r to its end, and refuses more than MaxFileBytes without
// reading past them.
func ReadAll(r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, errTooLarge()
	}
	return data, nil
}

// ReadFile is os.ReadFile bounded as ReadAll.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read-only
	return ReadAll(f)
}

func errTooLarge() error {
	return fmt.Errorf("%w: more than %d bytes (a BudgetSet is a few kilobytes): is it the right file?", ErrTooLarge, MaxFileBytes)
}

// Load parses, defaults and validates one BudgetSet document. filename is only
// used in error messages. A non-nil error is a yamlpos.List of every problem,
// each naming file:line and the field path.
func Load(data []byte, filename string) (*BudgetSet, error) {
	if len(data) > MaxFileBytes {
		return nil, yamlpos.List{&yamlpos.Error{File: filename, Msg: errTooLarge().Error()}}
	}
	opts := yamlpos.Options{File: filename, LinesOnly: true}
	root, perr := yamlpos.One(data, opts, "BudgetSet", "spec file")
	if perr != nil {
		return nil, yamlpos.List{perr}
	}
	bs := &BudgetSet{file: filename}
	pos, errs := yamlpos.Decode(root, bs, opts)
	bs.pos = pos
	if len(errs) > 0 {
		return nil, errs
	}
	Default(bs)
	if err := bs.Validate(); err != nil {
		return nil, err
	}
	return bs, nil
}

// LoadFile reads and loads a spec file; path "-" reads stdin from r.
func LoadFile(path string, stdin io.Reader) (*BudgetSet, error) {
	var (
		data []byte
		err  error
		name = path
	)
	if path == "-" {
		name = "<stdin>"
		data, err = ReadAll(stdin)
	} else {
		data, err = ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read spec %s: %w", name, err)
	}
	bs, err := Load(data, name)
	if err != nil {
		return nil, err
	}
	dir := "."
	if path != "-" {
		dir = filepath.Dir(path)
	}
	if err := bs.ReadBasePolicies(dir); err != nil {
		return nil, err
	}
	return bs, nil
}

// ReadBasePolicies reads every spec.gateways[].basePolicy, relative to dir
// (the spec's directory), into the gateway's Base. A file that cannot be read
// is an error naming the spec's line.
func (s *BudgetSet) ReadBasePolicies(dir string) error {
	var errs yamlpos.List
	for i := range s.Spec.Gateways {
		g := &s.Spec.Gateways[i]
		if g.BasePolicy == "" {
			continue
		}
		field := fmt.Sprintf("spec.gateways[%d].basePolicy", i)
		path := filepath.Join(dir, g.BasePolicy)
		data, err := ReadFile(path)
		if err != nil {
			errs = append(errs, s.Errorf(field, "read base policy: %v", err))
			continue
		}
		g.Base = &File{Path: path, Data: data}
	}
	return errs.Err()
}

// File is the file name the spec was loaded from ("" when built in Go).
func (s *BudgetSet) File() string { return s.file }

// Line is the source line of a field path such as "spec.budgets[2].mode", or of
// its nearest present ancestor when the field itself is absent; 0 when the
// BudgetSet was not loaded from YAML.
func (s *BudgetSet) Line(path string) int { return s.pos.Of(path).Line }

// Errorf is a problem with the field at path, positioned at its line (or
// its nearest present ancestor's) in the spec file.
func (s *BudgetSet) Errorf(path, format string, args ...any) *yamlpos.Error {
	return &yamlpos.Error{File: s.file, Line: s.Line(path), Path: path, Msg: fmt.Sprintf(format, args...)}
}
