package config

import (
	"errors"
	"fmt"
	"io"
	"slices"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// File is one YAML document source: Name is reported in errors.
type File struct {
	Name string
	Data []byte
}

// Document mirrors one YAML file of the reference's format (its YamlRoot).
type Document struct {
	Domain      string       `yaml:"domain"`
	Descriptors []Descriptor `yaml:"descriptors"`
	// pos is where each field path's value is in the file (nil for protos).
	pos yamlpos.Positions
}

// Descriptor mirrors one descriptor node.
type Descriptor struct {
	Key            string       `yaml:"key"`
	Value          string       `yaml:"value"`
	RateLimit      *Policy      `yaml:"rate_limit"`
	Descriptors    []Descriptor `yaml:"descriptors"`
	ShadowMode     bool         `yaml:"shadow_mode"`
	QuotaMode      bool         `yaml:"quota_mode"`
	DetailedMetric bool         `yaml:"detailed_metric"`
	ValueToMetric  bool         `yaml:"value_to_metric"`
	ShareThreshold bool         `yaml:"share_threshold"`
}

// Policy mirrors a descriptor's rate_limit.
type Policy struct {
	Unit            string    `yaml:"unit"`
	RequestsPerUnit uint32    `yaml:"requests_per_unit"`
	Unlimited       bool      `yaml:"unlimited"`
	Name            string    `yaml:"name"`
	Replaces        []Replace `yaml:"replaces"`
}

// Replace is one entry of a rate_limit's replaces: the name of the limit
// this one replaces.
type Replace struct {
	Name string `yaml:"name"`
}

// textTags are the YAML types the reference takes as text besides strings:
// its key walk (validateYamlKeys) accepts string, integer and boolean
// leaves, where yaml.v2 leaves a timestamp-like scalar a string, and a
// float fails "error checking config"; its typed decode then puts any of
// these into a string field as written.
var textTags = []string{"!!int", "!!bool", "!!timestamp"}

// maxDepth bounds nesting far above any config: the reference has no bound
// of its own beyond its YAML parser's.
const maxDepth = 10_000

// Parse decodes one YAML file in the reference's format, every problem with
// file:line:column: field. Like the reference's yaml.Unmarshal, only the
// first document of a file is read. Unknown keys, wrong types and aliases
// are refused; a key the reference knows at another level is accepted
// where it means nothing (see elsewhere). A non-nil error is a
// *yamlpos.Error or a yamlpos.List of them.
func Parse(f File) (*Document, error) {
	opts := yamlpos.Options{File: f.Name, MaxDepth: maxDepth, Tag: "yaml", NoAliases: true, StringTags: textTags}
	opts.Unknown = func(k, v *yaml.Node, path string) *yamlpos.Error { return elsewhere(opts, k, v, path) }
	doc, err := yamlpos.NewReader(f.Data, opts).Next()
	if errors.Is(err, io.EOF) || (err == nil && len(doc.Content) == 0) {
		return nil, yamlpos.List{{File: f.Name, Path: "domain", Msg: "config file cannot have empty domain"}}
	}
	if err != nil {
		return nil, err // a *yamlpos.Error
	}
	root := doc.Content[0]
	d := &Document{}
	pos, errs := yamlpos.Decode(root, d, opts)
	if len(errs) > 0 {
		return nil, errs
	}
	d.pos = pos
	if d.Domain == "" {
		return nil, yamlpos.List{opts.Errorf(root, "domain", "config file cannot have empty domain")}
	}
	return d, nil
}

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
// reference's key walk (walkKeys); any other key is refused.
func elsewhere(o yamlpos.Options, k, v *yaml.Node, path string) *yamlpos.Error {
	switch {
	case k.ShortTag() != "!!str":
		return o.Errorf(k, path, "key is not a string")
	case k.Value == "metadata":
		// Added to the reference's key set in July 2026, after the version
		// test/reftest pins; not implemented here (docs/compatibility.md).
		return o.Errorf(k, path, "unknown key %q: descriptor metadata is not supported", k.Value)
	case !referenceKeys[k.Value]:
		return o.Errorf(k, path, "unknown key %q", k.Value)
	}
	return walkKeys(o, v, path)
}

// walkKeys is the reference's validateYamlKeys on an ignored value: keys of
// nested maps in the set, lists of maps only, scalars that are strings,
// integers, booleans or null.
func walkKeys(o yamlpos.Options, v *yaml.Node, path string) *yamlpos.Error {
	switch v.Kind {
	case yaml.MappingNode:
		seen := map[string]bool{}
		for i := 0; i+1 < len(v.Content); i += 2 {
			k, val := v.Content[i], v.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return o.Errorf(k, path, "key is not a string")
			}
			p := yamlpos.Join(path, k.Value)
			if seen[k.Value] {
				return o.Errorf(k, p, "duplicate key %q", k.Value)
			}
			seen[k.Value] = true
			if err := elsewhere(o, k, val, p); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for i, item := range v.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if item.Kind != yaml.MappingNode {
				return o.Errorf(item, p, "must be a mapping (the reference's lists hold mappings only)")
			}
			if err := walkKeys(o, item, p); err != nil {
				return err
			}
		}
	case yaml.ScalarNode:
		switch tag := v.ShortTag(); {
		case tag == "!!str" || tag == "!!null" || slices.Contains(textTags, tag):
		default:
			return o.Errorf(v, path, "must be a string, integer or boolean, got %s", v.ShortTag())
		}
	case yaml.AliasNode:
		return o.Errorf(v, path, "aliases are not supported")
	}
	return nil
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
