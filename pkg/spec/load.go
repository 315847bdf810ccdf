package spec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// Load parses, defaults and validates one BudgetSet document. filename is only
// used in error messages. A non-nil error is an ErrorList of FieldErrors, each
// naming file:line and the field path.
func Load(data []byte, filename string) (*BudgetSet, error) {
	var errs ErrorList
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			errs.add(filename, 0, "", "empty document: expected a BudgetSet")
			return nil, errs
		}
		errs.add(filename, yamlErrLine(err), "", "invalid YAML: "+yamlErrMsg(err))
		return nil, errs
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		errs.add(filename, extra.Line, "", "more than one YAML document: a spec file holds exactly one BudgetSet")
		return nil, errs
	} else if !errors.Is(err, io.EOF) {
		errs.add(filename, yamlErrLine(err), "", "invalid YAML: "+yamlErrMsg(err))
		return nil, errs
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	bs := &BudgetSet{pos: map[string]int{}, file: filename}
	d := &decoder{pos: bs.pos, errs: &errs, file: filename}
	d.decode(root, reflect.ValueOf(bs).Elem(), "")
	if len(errs) > 0 {
		errs.sort()
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
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(path)
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
	var errs ErrorList
	for i := range s.Spec.Gateways {
		g := &s.Spec.Gateways[i]
		if g.BasePolicy == "" {
			continue
		}
		field := fmt.Sprintf("spec.gateways[%d].basePolicy", i)
		path := filepath.Join(dir, g.BasePolicy)
		data, err := os.ReadFile(path)
		if err != nil {
			errs.add(s.file, s.Line(field), field, fmt.Sprintf("read base policy: %v", err))
			continue
		}
		g.Base = &File{Path: path, Data: data}
	}
	if len(errs) > 0 {
		errs.sort()
		return errs
	}
	return nil
}

var yamlLineRE = regexp.MustCompile(`line (\d+):`)

// yamlErrLine digs the line out of yaml.v3's syntax error text ("yaml: line 3: ...").
func yamlErrLine(err error) int {
	m := yamlLineRE.FindStringSubmatch(err.Error())
	if m == nil {
		return 0
	}
	var n int
	_, _ = fmt.Sscanf(m[1], "%d", &n) // the regexp matched digits; 0 (no line) if it overflows
	return n
}

func yamlErrMsg(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	return strings.TrimSpace(yamlLineRE.ReplaceAllString(msg, ""))
}

// File is the file name the spec was loaded from ("" when built in Go).
func (s *BudgetSet) File() string { return s.file }

// Line is the source line of a field path such as "spec.budgets[2].mode", or of
// its nearest present ancestor when the field itself is absent; 0 when the
// BudgetSet was not loaded from YAML.
func (s *BudgetSet) Line(path string) int {
	for {
		if l, ok := s.pos[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			return s.pos[""]
		}
		path = path[:i]
	}
}
