package config

import (
	"fmt"
	"strings"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

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
			return nil, &yamlpos.Error{File: name, Path: "domain", Msg: "config file cannot have empty domain"}
		}
		if _, dup := c.domains[doc.Domain]; dup {
			return nil, &yamlpos.Error{File: name, Path: "domain", Msg: fmt.Sprintf("duplicate domain '%s' in config file", doc.Domain)}
		}
		b := &builder{c: c, file: name, domain: doc.Domain, pos: doc.pos}
		root := &node{children: map[string]*node{}}
		if err := b.descriptors(root, doc.Domain+".", "descriptors", nil, doc.Descriptors); err != nil {
			return nil, err
		}
		c.domains[doc.Domain] = root
		c.sources = append(c.sources, name)
	}
	return c, nil
}

// builder adds one document's descriptors to a Config.
type builder struct {
	c            *Config
	file, domain string
	pos          yamlpos.Positions
}

// at is a problem with the field at path, positioned where the file has it
// (or its nearest parent; nowhere for a proto).
func (b *builder) at(path, msg string) *yamlpos.Error {
	p := b.pos.Of(path)
	return &yamlpos.Error{File: b.file, Line: p.Line, Column: p.Column, Path: path, Msg: msg}
}

// descriptors adds ds, the descriptors at path, under parent, whose
// composite key is parentKey and config path cfgPath.
func (b *builder) descriptors(parent *node, parentKey, path string, cfgPath []PathEntry, ds []Descriptor) error {
	for i := range ds {
		if err := b.descriptor(parent, parentKey, fmt.Sprintf("%s[%d]", path, i), cfgPath, &ds[i]); err != nil {
			return err
		}
	}
	return nil
}

func (b *builder) descriptor(parent *node, parentKey, field string, cfgPath []PathEntry, d *Descriptor) error {
	if d.Key == "" {
		return b.at(field+".key", "descriptor has empty key")
	}
	b.noteNotApplied(field, d)
	finalKey := d.Key
	if d.Value != "" {
		finalKey += "_" + d.Value
	}
	fullKey := parentKey + finalKey
	if _, dup := parent.children[finalKey]; dup {
		return b.at(field, fmt.Sprintf("duplicate descriptor composite key '%s'", fullKey))
	}
	n := &node{children: map[string]*node{}, shareThreshold: d.ShareThreshold}
	here := append(cfgPath[:len(cfgPath):len(cfgPath)], PathEntry{Key: d.Key, Value: d.Value})
	if d.RateLimit != nil {
		lim, err := b.limit(field+".rate_limit", fullKey, here, d)
		if err != nil {
			return err
		}
		n.limit = lim
	}
	if d.ShareThreshold {
		if !strings.HasSuffix(finalKey, "*") {
			return b.at(field+".share_threshold", fmt.Sprintf("share_threshold can only be used with wildcard values (ending with '*'), but found key '%s'", finalKey))
		}
		n.wildcardPattern = finalKey
	}
	if strings.HasSuffix(finalKey, "*") {
		parent.wildcards = append(parent.wildcards, finalKey)
	}
	if err := b.descriptors(n, fullKey+".", field+".descriptors", here, d.Descriptors); err != nil {
		return err
	}
	parent.children[finalKey] = n
	return nil
}

// noteNotApplied records the keys of d the reference gives a meaning this
// service accepts but does not apply.
func (b *builder) noteNotApplied(field string, d *Descriptor) {
	note := func(sub, why string) {
		b.c.notApplied = append(b.c.notApplied, b.at(field+"."+sub, why).Error())
	}
	if d.DetailedMetric {
		note("detailed_metric", "accepted, not applied: metric labels here never carry request values (docs/compatibility.md)")
	}
	if d.ValueToMetric {
		note("value_to_metric", "accepted, not applied: metric labels here never carry request values (docs/compatibility.md)")
	}
	if i := strings.IndexByte(d.Value, '*'); i >= 0 && i < len(d.Value)-1 {
		note("value", "a '*' before the end is matched literally, as the pinned reference does (newer references treat it as a wildcard)")
	}
}

// limit checks and adds the limit of descriptor d, at path, whose composite
// key is rule and config path here.
func (b *builder) limit(path, rule string, here []PathEntry, d *Descriptor) (*RateLimit, error) {
	rl := d.RateLimit
	v, ok := rlpb.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(rl.Unit)]
	valid := ok && v != int32(rlpb.RateLimitResponse_RateLimit_UNKNOWN)
	if rl.Unlimited {
		if valid {
			return nil, b.at(path+".unit", "should not specify rate limit unit when unlimited")
		}
	} else if !valid {
		return nil, b.at(path+".unit", fmt.Sprintf("invalid rate limit unit '%s'", rl.Unit))
	}
	replaces := make([]string, len(rl.Replaces))
	for i, r := range rl.Replaces {
		p := fmt.Sprintf("%s.replaces[%d].name", path, i)
		if r.Name == "" {
			return nil, b.at(p, "should not have an empty replaces entry")
		}
		if r.Name == rl.Name {
			return nil, b.at(p, "replaces should not contain name of same descriptor")
		}
		replaces[i] = r.Name
	}
	u := Unit(v)
	if !valid {
		u = rlpb.RateLimitResponse_RateLimit_UNKNOWN
	}
	lim := &RateLimit{
		Index: len(b.c.limits), Domain: b.domain, Rule: rule, Unit: u, Divider: Divider(u),
		RequestsPerUnit: rl.RequestsPerUnit, Unlimited: rl.Unlimited, ShadowMode: d.ShadowMode,
		QuotaMode: d.QuotaMode, DetailedMetric: d.DetailedMetric, Name: rl.Name, Replaces: replaces,
		Proto: &rlpb.RateLimitResponse_RateLimit{RequestsPerUnit: rl.RequestsPerUnit, Unit: u, Name: rl.Name},
		Path:  here,
	}
	if b.c.scope != nil {
		r := b.c.scope(b.domain, here)
		lim.Scope, lim.Budget = r.Scope, r.Budget
	}
	b.c.limits = append(b.c.limits, lim)
	return lim, nil
}
