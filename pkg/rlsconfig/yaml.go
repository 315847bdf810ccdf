package rlsconfig

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"gopkg.in/yaml.v3"
)

// MarshalYAML writes cfg in the reference service's runtime file format (one
// domain per file): domain, descriptors[] {key, value, rate_limit {unit,
// requests_per_unit, unlimited, name, replaces[{name}]}, shadow_mode,
// detailed_metric, descriptors[]}. Fields at their zero value are left out,
// except requests_per_unit, which is always written (0 is a kill switch).
// Units are written in upper case, as the reference's xDS-to-YAML conversion
// does. The output is deterministic: field order is fixed and descriptors keep
// their order.
func MarshalYAML(cfg *rlsconfv3.RateLimitConfig) ([]byte, error) {
	if cfg == nil || cfg.Domain == "" {
		return nil, errors.New("rate limit config without a domain")
	}
	root := mapping()
	put(root, "domain", str(cfg.Domain))
	if len(cfg.Descriptors) > 0 {
		ds, err := descriptorsNode(cfg.Descriptors, "descriptors")
		if err != nil {
			return nil, fmt.Errorf("domain %s: %w", cfg.Domain, err)
		}
		put(root, "descriptors", ds)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root}}); err != nil {
		return nil, fmt.Errorf("domain %s: encode yaml: %w", cfg.Domain, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("domain %s: encode yaml: %w", cfg.Domain, err)
	}
	return buf.Bytes(), nil
}

func descriptorsNode(ds []*rlsconfv3.RateLimitDescriptor, path string) (*yaml.Node, error) {
	seq := &yaml.Node{Kind: yaml.SequenceNode}
	for i, d := range ds {
		p := fmt.Sprintf("%s[%d]", path, i)
		if d == nil || d.Key == "" {
			return nil, fmt.Errorf("%s: descriptor without a key", p)
		}
		n := mapping()
		put(n, "key", str(d.Key))
		if d.Value != "" {
			put(n, "value", str(d.Value))
		}
		if rl := d.RateLimit; rl != nil {
			r := mapping()
			if rl.Unit != rlsconfv3.RateLimitUnit_UNKNOWN {
				put(r, "unit", str(rl.Unit.String()))
			} else if !rl.Unlimited {
				return nil, fmt.Errorf("%s.rate_limit: unit is required unless unlimited", p)
			}
			put(r, "requests_per_unit", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatUint(uint64(rl.RequestsPerUnit), 10)})
			if rl.Unlimited {
				put(r, "unlimited", boolean(true))
			}
			if rl.Name != "" {
				put(r, "name", str(rl.Name))
			}
			if len(rl.Replaces) > 0 {
				rs := &yaml.Node{Kind: yaml.SequenceNode}
				for _, rep := range rl.Replaces {
					m := mapping()
					put(m, "name", str(rep.GetName()))
					rs.Content = append(rs.Content, m)
				}
				put(r, "replaces", rs)
			}
			put(n, "rate_limit", r)
		}
		if d.ShadowMode {
			put(n, "shadow_mode", boolean(true))
		}
		if d.DetailedMetric {
			put(n, "detailed_metric", boolean(true))
		}
		if len(d.Descriptors) > 0 {
			sub, err := descriptorsNode(d.Descriptors, p+".descriptors")
			if err != nil {
				return nil, err
			}
			put(n, "descriptors", sub)
		}
		seq.Content = append(seq.Content, n)
	}
	return seq, nil
}

func mapping() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode} }

func put(m *yaml.Node, k string, v *yaml.Node) {
	m.Content = append(m.Content, str(k), v)
}

// str is a string scalar; yaml.v3 quotes it when it would otherwise read as
// another type (true, 0, null ...).
func str(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }

func boolean(b bool) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)}
}

// FileName is the file one domain is written to in a runtime config directory.
// Domains EG derives are <ns>/<policy>, Kubernetes names that contain no "_",
// so <ns>_<policy>.yaml is unambiguous; other characters outside [A-Za-z0-9.-]
// (and a leading dot) are replaced so that any domain yields a plain, visible
// file name.
func FileName(domain string) string {
	var b strings.Builder
	for i, r := range domain {
		switch {
		case i == 0 && r == '.': // a dot file would be skipped by RUNTIME_IGNOREDOTFILES
			b.WriteByte('_')
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String() + ".yaml"
}

// WriteDir writes one YAML file per config into dir (created if missing).
// Every file is written to a temporary file in dir, synced and renamed over
// the target, so a reader (the service watching the directory) never sees a
// partial file. All files are encoded before any is written, and two domains
// mapping to the same file name are an error, so a bad config writes nothing.
// Files of other domains already in dir are left alone.
func WriteDir(dir string, cfgs []*rlsconfv3.RateLimitConfig) ([]string, error) {
	type out struct {
		name string
		data []byte
	}
	files := make([]out, 0, len(cfgs))
	byName := map[string]string{}
	for _, c := range cfgs {
		data, err := MarshalYAML(c)
		if err != nil {
			return nil, err
		}
		name := FileName(c.Domain)
		if other, dup := byName[name]; dup {
			return nil, fmt.Errorf("domains %q and %q would both be written to %s", other, c.Domain, name)
		}
		byName[name] = c.Domain
		files = append(files, out{name, data})
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	written := make([]string, 0, len(files))
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		if err := writeFileAtomic(path, f.data); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	return written, nil
}

func writeFileAtomic(path string, data []byte) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = tmp.Chmod(0o644); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
