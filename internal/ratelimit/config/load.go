package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"gopkg.in/yaml.v3"
)

// File is one YAML document source: Name is reported in errors.
type File struct {
	Name string
	Data []byte
}

// Error is a config error with its position. Line and Column are 0 when the
// error is not tied to a position (for example a duplicate domain).
type Error struct {
	File   string
	Line   int
	Column int
	Field  string
	Msg    string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
	}
	if e.Field != "" {
		b.WriteString(": ")
		b.WriteString(e.Field)
	}
	b.WriteString(": ")
	b.WriteString(e.Msg)
	return b.String()
}

// Document mirrors one YAML file of the reference's format.
type Document struct {
	Domain      string
	Descriptors []Descriptor
}

// Descriptor mirrors one descriptor node.
type Descriptor struct {
	Key            string
	Value          string
	RateLimit      *Policy
	Descriptors    []Descriptor
	ShadowMode     bool
	QuotaMode      bool
	DetailedMetric bool
	ValueToMetric  bool
	ShareThreshold bool
	// Line and Column locate the descriptor in its file (0 for protos).
	Line, Column int
}

// Policy mirrors a descriptor's rate_limit.
type Policy struct {
	Unit            string
	RequestsPerUnit uint32
	Unlimited       bool
	Name            string
	Replaces        []string
	Line, Column    int
}

// Parse decodes one YAML file in the reference's format. Unknown keys, wrong
// types and multi-document files are rejected with file:line:column: field.
func Parse(f File) (*Document, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(f.Data, &root); err != nil {
		return nil, &Error{File: f.Name, Msg: "invalid yaml: " + err.Error()}
	}
	p := parser{file: f.Name}
	doc := &Document{}
	if root.Kind == 0 || len(root.Content) == 0 {
		return nil, &Error{File: f.Name, Field: "domain", Msg: "config file cannot have empty domain"}
	}
	top := root.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, p.errf(top, "", "expected a mapping at the top level, got %s", kindName(top))
	}
	err := p.mapping(top, "", func(k string, kn, v *yaml.Node) error {
		switch k {
		case "domain":
			s, err := p.str(v, "domain")
			doc.Domain = s
			return err
		case "descriptors":
			ds, err := p.descriptors(v, "descriptors")
			doc.Descriptors = ds
			return err
		}
		return p.elsewhere(kn, v, k, k)
	})
	if err != nil {
		return nil, err
	}
	if doc.Domain == "" {
		return nil, p.errf(top, "domain", "config file cannot have empty domain")
	}
	return doc, nil
}

type parser struct{ file string }

// referenceKeys is the reference's one flat set of valid keys (validKeys in
// its src/config/config_impl.go at the pinned version): it checks every key
// of a file against it, whatever its level, and then decodes the file into
// typed structs that ignore the keys they do not have. So a known key at a
// level where it means nothing (Envoy Gateway's RateLimitConfig YAML has a
// top-level name:) loads there, and changes nothing.
var referenceKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true, "unit": true,
	"requests_per_unit": true, "unlimited": true, "shadow_mode": true, "quota_mode": true, "name": true,
	"replaces": true, "detailed_metric": true, "value_to_metric": true, "share_threshold": true,
}

// elsewhere handles a key the level does not use: one of referenceKeys is
// accepted and ignored, as the reference does, once its value passes the
// reference's key walk (keys of nested maps in the set, lists of maps only,
// scalars that are strings, integers, booleans or null); any other key is
// refused.
func (p *parser) elsewhere(kn, v *yaml.Node, k, field string) error {
	if k == "metadata" {
		// Added to the reference's key set in July 2026, after the version
		// test/reftest pins; not implemented here (docs/compatibility.md).
		return p.errf(kn, field, "unknown key %q: descriptor metadata is not supported", k)
	}
	if !referenceKeys[k] {
		return p.errf(kn, field, "unknown key %q", k)
	}
	return p.walkKeys(v, field)
}

// walkKeys is the reference's validateYamlKeys on an ignored value.
func (p *parser) walkKeys(v *yaml.Node, field string) error {
	switch v.Kind {
	case yaml.MappingNode:
		return p.mapping(v, field, func(k string, kn, val *yaml.Node) error {
			return p.elsewhere(kn, val, k, field+"."+k)
		})
	case yaml.SequenceNode:
		for i, item := range v.Content {
			if item.Kind != yaml.MappingNode {
				return p.errf(item, fmt.Sprintf("%s[%d]", field, i), "expected a mapping in the list, got %s", kindName(item))
			}
			if err := p.walkKeys(item, fmt.Sprintf("%s[%d]", field, i)); err != nil {
				return err
			}
		}
		return nil
	case yaml.ScalarNode:
		switch v.Tag {
		case "!!str", "!!int", "!!bool", "!!null", "":
			return nil
		}
		return p.errf(v, field, "expected a string, integer or boolean, got %s", v.Tag)
	case yaml.AliasNode:
		return p.errf(v, field, "aliases are not supported")
	}
	return p.errf(v, field, "unexpected %s", kindName(v))
}

func (p *parser) errf(n *yaml.Node, field, format string, args ...any) error {
	e := &Error{File: p.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	return e
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return "a scalar"
	case yaml.AliasNode:
		return "an alias"
	}
	return "nothing"
}

// mapping walks a mapping node, rejecting non-string and duplicate keys.
func (p *parser) mapping(n *yaml.Node, path string, fn func(k string, kn, v *yaml.Node) error) error {
	if n.Kind != yaml.MappingNode {
		return p.errf(n, path, "expected a mapping, got %s", kindName(n))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, v := n.Content[i], n.Content[i+1]
		if kn.Kind != yaml.ScalarNode || (kn.Tag != "!!str" && kn.Tag != "") {
			return p.errf(kn, path, "key is not a string")
		}
		field := kn.Value
		if path != "" {
			field = path + "." + kn.Value
		}
		if seen[kn.Value] {
			return p.errf(kn, field, "duplicate key %q", kn.Value)
		}
		seen[kn.Value] = true
		if v.Kind == yaml.AliasNode {
			return p.errf(v, field, "aliases are not supported")
		}
		if err := fn(kn.Value, kn, v); err != nil {
			return err
		}
	}
	return nil
}

// str accepts any scalar as text (as the reference's yaml.v2 decoding does);
// null is the empty string.
func (p *parser) str(v *yaml.Node, field string) (string, error) {
	if v.Kind != yaml.ScalarNode {
		return "", p.errf(v, field, "expected a string, got %s", kindName(v))
	}
	switch v.Tag {
	case "!!null":
		return "", nil
	case "!!str", "!!int", "!!bool", "":
		return v.Value, nil
	}
	// The reference rejects float scalars anywhere ("error checking config").
	return "", p.errf(v, field, "expected a string, got %s", v.Tag)
}

func (p *parser) boolean(v *yaml.Node, field string) (bool, error) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return false, nil
	}
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
		return false, p.errf(v, field, "expected true or false, got %q", v.Value)
	}
	var b bool
	if err := v.Decode(&b); err != nil {
		return false, p.errf(v, field, "expected true or false: %v", err)
	}
	return b, nil
}

func (p *parser) uint32(v *yaml.Node, field string) (uint32, error) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return 0, nil
	}
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
		return 0, p.errf(v, field, "expected a non-negative integer, got %q", v.Value)
	}
	s := strings.ReplaceAll(v.Value, "_", "")
	u, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return 0, p.errf(v, field, "expected an integer between 0 and 4294967295, got %q", v.Value)
	}
	return uint32(u), nil
}

func (p *parser) descriptors(v *yaml.Node, path string) ([]Descriptor, error) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return nil, nil
	}
	if v.Kind != yaml.SequenceNode {
		return nil, p.errf(v, path, "expected a list of descriptors, got %s", kindName(v))
	}
	out := make([]Descriptor, 0, len(v.Content))
	for i, item := range v.Content {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		d := Descriptor{Line: item.Line, Column: item.Column}
		err := p.mapping(item, ipath, func(k string, kn, val *yaml.Node) error {
			f := ipath + "." + k
			var err error
			switch k {
			case "key":
				d.Key, err = p.str(val, f)
			case "value":
				d.Value, err = p.str(val, f)
			case "rate_limit":
				d.RateLimit, err = p.policy(val, f)
			case "descriptors":
				d.Descriptors, err = p.descriptors(val, f)
			case "shadow_mode":
				d.ShadowMode, err = p.boolean(val, f)
			case "quota_mode":
				d.QuotaMode, err = p.boolean(val, f)
			case "detailed_metric":
				d.DetailedMetric, err = p.boolean(val, f)
			case "value_to_metric":
				d.ValueToMetric, err = p.boolean(val, f)
			case "share_threshold":
				d.ShareThreshold, err = p.boolean(val, f)
			default:
				err = p.elsewhere(kn, val, k, f)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func (p *parser) policy(v *yaml.Node, path string) (*Policy, error) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return nil, nil
	}
	pol := &Policy{Line: v.Line, Column: v.Column}
	err := p.mapping(v, path, func(k string, kn, val *yaml.Node) error {
		f := path + "." + k
		var err error
		switch k {
		case "unit":
			pol.Unit, err = p.str(val, f)
		case "requests_per_unit":
			pol.RequestsPerUnit, err = p.uint32(val, f)
		case "unlimited":
			pol.Unlimited, err = p.boolean(val, f)
		case "name":
			pol.Name, err = p.str(val, f)
		case "replaces":
			pol.Replaces, err = p.replaces(val, f)
		default:
			err = p.elsewhere(kn, val, k, f)
		}
		return err
	})
	return pol, err
}

func (p *parser) replaces(v *yaml.Node, path string) ([]string, error) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return nil, nil
	}
	if v.Kind != yaml.SequenceNode {
		return nil, p.errf(v, path, "expected a list of {name: ...}, got %s", kindName(v))
	}
	out := make([]string, 0, len(v.Content))
	for i, item := range v.Content {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		name := ""
		err := p.mapping(item, ipath, func(k string, kn, val *yaml.Node) error {
			if k != "name" {
				return p.elsewhere(kn, val, k, ipath+"."+k)
			}
			var err error
			name, err = p.str(val, ipath+".name")
			return err
		})
		if err != nil {
			return nil, err
		}
		if name == "" {
			return nil, p.errf(item, ipath+".name", "should not have an empty replaces entry")
		}
		out = append(out, name)
	}
	return out, nil
}

// Build turns parsed documents into a Config, applying the reference's
// validation: non-empty domain and keys, valid units, no unit with unlimited,
// no duplicate descriptor or domain, replaces not naming itself, share_threshold
// only on wildcards. names[i] names docs[i] in errors.
func Build(docs []*Document, names []string) (*Config, error) {
	return BuildScoped(docs, names, nil)
}

// BuildScoped is Build with every limit's Scope resolved by scope (nil: none).
func BuildScoped(docs []*Document, names []string, scope ScopeFunc) (*Config, error) {
	c := &Config{domains: map[string]*node{}, docs: docs, names: names, scope: scope}
	for i, doc := range docs {
		name := names[i]
		if doc.Domain == "" {
			return nil, &Error{File: name, Field: "domain", Msg: "config file cannot have empty domain"}
		}
		if _, dup := c.domains[doc.Domain]; dup {
			return nil, &Error{File: name, Field: "domain", Msg: fmt.Sprintf("duplicate domain '%s' in config file", doc.Domain)}
		}
		root := &node{children: map[string]*node{}}
		if err := c.load(name, doc.Domain, root, doc.Domain+".", "descriptors", nil, doc.Descriptors); err != nil {
			return nil, err
		}
		c.domains[doc.Domain] = root
		c.sources = append(c.sources, name)
	}
	return c, nil
}

func (c *Config) load(file, domain string, parent *node, parentKey, path string, cfgPath []PathEntry, ds []Descriptor) error {
	for i, d := range ds {
		field := fmt.Sprintf("%s[%d]", path, i)
		errAt := func(sub, msg string) error {
			f := field
			if sub != "" {
				f += "." + sub
			}
			return &Error{File: file, Line: d.Line, Column: d.Column, Field: f, Msg: msg}
		}
		if d.Key == "" {
			return errAt("key", "descriptor has empty key")
		}
		notApplied := func(sub, why string) {
			c.notApplied = append(c.notApplied, fmt.Sprintf("%s:%d:%d: %s.%s: %s", file, d.Line, d.Column, field, sub, why))
		}
		if d.DetailedMetric {
			notApplied("detailed_metric", "accepted, not applied: metric labels here never carry request values (docs/compatibility.md)")
		}
		if d.ValueToMetric {
			notApplied("value_to_metric", "accepted, not applied: metric labels here never carry request values (docs/compatibility.md)")
		}
		if i := strings.IndexByte(d.Value, '*'); i >= 0 && i < len(d.Value)-1 {
			notApplied("value", "a '*' before the end is matched literally, as the pinned reference does (newer references treat it as a wildcard)")
		}
		finalKey := d.Key
		if d.Value != "" {
			finalKey += "_" + d.Value
		}
		fullKey := parentKey + finalKey
		if _, dup := parent.children[finalKey]; dup {
			return errAt("", fmt.Sprintf("duplicate descriptor composite key '%s'", fullKey))
		}
		n := &node{children: map[string]*node{}, shareThreshold: d.ShareThreshold}
		here := append(cfgPath[:len(cfgPath):len(cfgPath)], PathEntry{Key: d.Key, Value: d.Value})
		if d.RateLimit != nil {
			lim, err := c.newLimit(domain, fullKey, &d, here, errAt)
			if err != nil {
				return err
			}
			c.limits = append(c.limits, lim)
			n.limit = lim
		}
		if d.ShareThreshold {
			if !strings.HasSuffix(finalKey, "*") {
				return errAt("share_threshold", fmt.Sprintf("share_threshold can only be used with wildcard values (ending with '*'), but found key '%s'", finalKey))
			}
			n.wildcardPattern = finalKey
		}
		if strings.HasSuffix(finalKey, "*") {
			parent.wildcards = append(parent.wildcards, finalKey)
		}
		if err := c.load(file, domain, n, fullKey+".", field+".descriptors", here, d.Descriptors); err != nil {
			return err
		}
		parent.children[finalKey] = n
	}
	return nil
}

// newLimit builds the limit of descriptor d (whose rate_limit is set), at
// composite key fullKey and config path here, with its budget scope.
func (c *Config) newLimit(domain, fullKey string, d *Descriptor, here []PathEntry, errAt func(sub, msg string) error) (*RateLimit, error) {
	rl := d.RateLimit
	v, ok := rlpb.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(rl.Unit)]
	valid := ok && v != int32(rlpb.RateLimitResponse_RateLimit_UNKNOWN)
	if rl.Unlimited {
		if valid {
			return nil, errAt("rate_limit.unit", "should not specify rate limit unit when unlimited")
		}
	} else if !valid {
		return nil, errAt("rate_limit.unit", fmt.Sprintf("invalid rate limit unit '%s'", rl.Unit))
	}
	for _, r := range rl.Replaces {
		if r == "" {
			return nil, errAt("rate_limit.replaces", "should not have an empty replaces entry")
		}
		if r == rl.Name {
			return nil, errAt("rate_limit.replaces", "replaces should not contain name of same descriptor")
		}
	}
	u := Unit(v)
	if !valid {
		u = rlpb.RateLimitResponse_RateLimit_UNKNOWN
	}
	lim := &RateLimit{
		Index: len(c.limits), Domain: domain, Rule: fullKey, Unit: u, Divider: Divider(u),
		RequestsPerUnit: rl.RequestsPerUnit, Unlimited: rl.Unlimited, ShadowMode: d.ShadowMode,
		QuotaMode: d.QuotaMode, DetailedMetric: d.DetailedMetric, Name: rl.Name,
		Replaces: append([]string(nil), rl.Replaces...),
		Proto:    &rlpb.RateLimitResponse_RateLimit{RequestsPerUnit: rl.RequestsPerUnit, Unit: u, Name: rl.Name},
		Path:     here,
	}
	if c.scope != nil {
		r := c.scope(domain, here)
		lim.Scope, lim.Budget = r.Scope, r.Budget
	}
	return lim, nil
}

// Load parses and builds a config from files, in the given order.
func Load(files []File) (*Config, error) {
	docs := make([]*Document, 0, len(files))
	names := make([]string, 0, len(files))
	for _, f := range files {
		d, err := Parse(f)
		if err != nil {
			return nil, err
		}
		docs = append(docs, d)
		names = append(names, f.Name)
	}
	return Build(docs, names)
}

// AsError returns the *Error in err's chain, if any.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
