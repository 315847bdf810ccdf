package rlsconfig

import (
	"bytes"
	"testing"
	"unicode/utf8"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	refconfig "github.com/envoyproxy/ratelimit/src/config"
	"gopkg.in/yaml.v3"
)

// FuzzMarshalYAMLRoundTrip: whatever the domain, keys and values (header
// values become descriptor values; YAML-looking strings such as "true", "~",
// "- x" or "a: b" included), the file we write reads back, with the reference
// service's own types, to exactly the same config.
func FuzzMarshalYAMLRoundTrip(f *testing.F) {
	for _, s := range [][3]string{
		{"llm/budgets", "rule-0-match-0", "alice"},
		{"true", "null", "~"},
		{"- x", "a: b", "#c"},
		{"0x10", "1e3", "'q'"},
		{" lead", "trail ", "multi\nline"},
		{"&anchor", "*alias", "!tag"},
	} {
		f.Add(s[0], s[1], s[2], uint32(0), true)
	}
	f.Fuzz(func(t *testing.T, domain, key, value string, rpu uint32, shadow bool) {
		if domain == "" || key == "" || !utf8.ValidString(domain) || !utf8.ValidString(key) || !utf8.ValidString(value) {
			return // rejected by the service anyway; YAML cannot carry invalid UTF-8
		}
		cfg := &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: key, Value: value,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: key, ShadowMode: shadow, RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: rpu}}},
		}}}
		data, err := MarshalYAML(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var got refconfig.YamlRoot
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("%q does not read back: %v", data, err)
		}
		want := refconfig.ConfigXdsProtoToYaml(cfg)
		if got.Domain != want.Domain || len(got.Descriptors) != 1 {
			t.Fatalf("domain %q != %q", got.Domain, want.Domain)
		}
		g, w := got.Descriptors[0], want.Descriptors[0]
		if g.Key != w.Key || g.Value != w.Value || len(g.Descriptors) != 1 {
			t.Fatalf("descriptor %q=%q, want %q=%q\n%s", g.Key, g.Value, w.Key, w.Value, data)
		}
		gl, wl := g.Descriptors[0], w.Descriptors[0]
		if gl.Key != wl.Key || gl.ShadowMode != wl.ShadowMode || gl.RateLimit == nil ||
			gl.RateLimit.Unit != wl.RateLimit.Unit || gl.RateLimit.RequestsPerUnit != wl.RateLimit.RequestsPerUnit {
			t.Fatalf("leaf differs:\n%s", data)
		}
	})
}
