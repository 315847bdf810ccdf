package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

const sample = `domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 3
  - key: path
    value: /api/*
    rate_limit:
      unit: minute
      requests_per_unit: 7
  - key: path
    value: /api/v2/*
    rate_limit:
      unit: minute
      requests_per_unit: 8
  - key: tenant
    descriptors:
      - key: user
        shadow_mode: true
        rate_limit:
          unit: hour
          requests_per_unit: 2
          name: per_user
      - key: vip
        value: "yes"
        rate_limit:
          unlimited: true
          replaces:
            - name: per_user
  - key: share
    value: f*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 9}
`

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func mustLoad(t *testing.T, docs ...string) *Config {
	t.Helper()
	var files []File
	for i, d := range docs {
		files = append(files, File{Name: "f" + string(rune('0'+i)) + ".yaml", Data: []byte(d)})
	}
	c, err := Load(files)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return c
}

func TestLookupMatchesReferenceOrder(t *testing.T) {
	c := mustLoad(t, sample)
	cases := []struct {
		name   string
		domain string
		d      *rlcommon.RateLimitDescriptor
		rule   string // "" = no limit
		share  []string
	}{
		{"key_value", "mongo_cps", desc("database", "users"), "mongo_cps.database_users", nil},
		{"unknown value, no bare key", "mongo_cps", desc("database", "other"), "", nil},
		{"bare key any value", "mongo_cps", desc("user", "alice"), "mongo_cps.user", nil},
		{"bare key empty value", "mongo_cps", desc("user", ""), "mongo_cps.user", nil},
		{"wildcard first in config order wins", "mongo_cps", desc("path", "/api/v2/x"), "mongo_cps.path_/api/*", nil},
		{"wildcard", "mongo_cps", desc("path", "/api/foo"), "mongo_cps.path_/api/*", nil},
		{"wildcard miss", "mongo_cps", desc("path", "/web"), "", nil},
		{"depth must equal: shallower", "mongo_cps", desc("tenant", "t1"), "", nil},
		{"nested", "mongo_cps", desc("tenant", "t1", "user", "u"), "mongo_cps.tenant.user", nil},
		{"depth must equal: deeper", "mongo_cps", desc("user", "a", "x", "y"), "", nil},
		{"unknown domain", "nope", desc("user", "a"), "", nil},
		{"share threshold", "mongo_cps", desc("share", "foo"), "mongo_cps.share_f*", []string{"f*"}},
		// The reference joins key and value with '_' for lookup: a request
		// {key: "database_users", value: ""} misses "database_users_" and then
		// falls back to the bare key "database_users", which is the map key of
		// {key: database, value: users}. Matching reproduces that quirk.
		{"joined lookup quirk", "mongo_cps", desc("database_users", ""), "mongo_cps.database_users", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := c.Lookup(tc.domain, tc.d, nil)
			got := ""
			if m.Limit != nil {
				got = m.Limit.Rule
			}
			if got != tc.rule {
				t.Fatalf("rule = %q, want %q", got, tc.rule)
			}
			if strings.Join(m.SharePatterns, ",") != strings.Join(tc.share, ",") {
				t.Fatalf("share = %q, want %q", m.SharePatterns, tc.share)
			}
		})
	}
	m, _ := c.Lookup("mongo_cps", desc("tenant", "t", "user", "u"), nil)
	if !m.Limit.ShadowMode || m.Limit.Unit != rlpb.RateLimitResponse_RateLimit_HOUR || m.Limit.RequestsPerUnit != 2 || m.Limit.Name != "per_user" {
		t.Fatalf("nested limit fields wrong: %+v", m.Limit)
	}
	m, _ = c.Lookup("mongo_cps", desc("tenant", "t", "vip", "yes"), nil)
	if !m.Limit.Unlimited || len(m.Limit.Replaces) != 1 || m.Limit.Replaces[0] != "per_user" {
		t.Fatalf("unlimited limit fields wrong: %+v", m.Limit)
	}
}

func TestLookupOverride(t *testing.T) {
	c := mustLoad(t, sample)
	d := desc("anything", "x")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 42, Unit: 3 /* HOUR */}
	m, _ := c.Lookup("mongo_cps", d, nil)
	if m.Limit == nil || !m.Override || m.Limit.RequestsPerUnit != 42 || m.Limit.Divider != 3600 {
		t.Fatalf("override not applied: %+v", m)
	}
	// Nothing in the config matched the entries: all are request-supplied,
	// so the ledger names the rule after the config ("<domain>.override"),
	// never after a caller's value.
	if m.Free != ^uint64(0) {
		t.Errorf("override Free = %b, want every entry free", m.Free)
	}
	if r, _ := ledger.FromDescriptor("mongo_cps", m.Limit.Rule, d.GetEntries(), m.Free); r.Rule != "mongo_cps.override" {
		t.Errorf("ledger rule of an override = %q, want mongo_cps.override", r.Rule)
	}
	if m2, _ := c.Lookup("unknown", d, nil); m2.Limit != nil {
		t.Fatal("override applied to an unknown domain; the reference ignores it")
	}
}

func TestDividerMatchesReference(t *testing.T) {
	want := map[rlpb.RateLimitResponse_RateLimit_Unit]int64{
		rlpb.RateLimitResponse_RateLimit_SECOND: 1, rlpb.RateLimitResponse_RateLimit_MINUTE: 60,
		rlpb.RateLimitResponse_RateLimit_HOUR: 3600, rlpb.RateLimitResponse_RateLimit_DAY: 86400,
		rlpb.RateLimitResponse_RateLimit_WEEK: 604800, rlpb.RateLimitResponse_RateLimit_MONTH: 2592000,
		rlpb.RateLimitResponse_RateLimit_YEAR: 31536000, rlpb.RateLimitResponse_RateLimit_UNKNOWN: 0,
	}
	for u, d := range want {
		if got := Divider(u); got != d {
			t.Errorf("Divider(%s) = %d, want %d", u, got, d)
		}
	}
}

func TestParseErrorsNamePosition(t *testing.T) {
	cases := []struct {
		name, yaml, want string
	}{
		{"unknown top key", "domain: d\nfoo: 1\n", "x.yaml:2:1: foo: unknown key \"foo\""},
		{"unknown nested key", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unitt: 1\n", "x.yaml:6:7: descriptors[0].rate_limit.requests_per_unitt: unknown key"},
		{"empty domain", "descriptors: []\n", "x.yaml:1:1: domain: config file cannot have empty domain"},
		{"empty file", "", "domain: config file cannot have empty domain"},
		{"empty key", "domain: d\ndescriptors:\n  - value: a\n", "x.yaml:3:5: descriptors[0].key: descriptor has empty key"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'"},
		{"unknown unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: unknown, requests_per_unit: 1}\n", "invalid rate limit unit 'unknown'"},
		{"unit with unlimited", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, unlimited: true}\n", "should not specify rate limit unit when unlimited"},
		{"negative", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "x.yaml:4:51: descriptors[0].rate_limit.requests_per_unit: must be an integer between 0 and 4294967295, got \"-1\""},
		{"too big", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n", "must be an integer between 0 and 4294967295, got \"4294967296\""},
		{"string count", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: \"5\"}\n", "x.yaml:4:51: descriptors[0].rate_limit.requests_per_unit: must be a non-negative integer, got \"5\""},
		{"bool type", "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: yes\n", "x.yaml:4:18: descriptors[0].shadow_mode: must be true or false, got \"yes\""},
		{"dup descriptor", "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a_b\n", "x.yaml:5:5: descriptors[1]: duplicate descriptor composite key 'd.a_b'"},
		{"dup yaml key", "domain: d\ndomain: e\n", "x.yaml:2:1: domain: duplicate field (first at line 1)"},
		{"replaces self", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}\n", "replaces should not contain name of same descriptor"},
		{"replaces empty", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: \"\"}]}\n", "should not have an empty replaces entry"},
		{"share non wildcard", "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n", "share_threshold can only be used with wildcard values"},
		{"list of scalars", "domain: d\ndescriptors: [a]\n", "x.yaml:2:15: descriptors[0]: must be a mapping, got \"a\""},
		{"float value", "domain: d\ndescriptors:\n  - key: a\n    value: 1.5\n", "x.yaml:4:12: descriptors[0].value: must be a string, got \"1.5\" (a float)"},
		{"top list", "- a\n", "x.yaml:1:1: the top level must be a mapping, got a list"},
		{"bad yaml", "domain: [\n", "x.yaml:1: invalid YAML: did not find expected node content"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]File{{Name: "x.yaml", Data: []byte(tc.yaml)}})
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			if e := (*yamlpos.Error)(nil); !errors.As(err, &e) || e.File != "x.yaml" {
				t.Fatalf("error %T is not a *yamlpos.Error naming the file", err)
			}
		})
	}
}

func TestParseAcceptsScalarsAsStrings(t *testing.T) {
	c := mustLoad(t, "domain: 5\ndescriptors:\n  - key: code\n    value: 429\n    rate_limit: {unit: SECOND, requests_per_unit: 0}\n  - key: flag\n    value: true\n    rate_limit: {unit: Minute, requests_per_unit: 1_000}\n  - key: day\n    value: 2026-12-14\n    rate_limit: {unit: day, requests_per_unit: 7}\n")
	m, _ := c.Lookup("5", desc("code", "429"), nil)
	if m.Limit == nil || m.Limit.RequestsPerUnit != 0 {
		t.Fatalf("int value not matched as string: %+v", m.Limit)
	}
	m, _ = c.Lookup("5", desc("flag", "true"), nil)
	if m.Limit == nil || m.Limit.RequestsPerUnit != 1000 || m.Limit.Divider != 60 {
		t.Fatalf("bool value / mixed-case unit: %+v", m.Limit)
	}
	// yaml.v3 tags 2026-12-14 a timestamp; the reference's yaml.v2 keeps it
	// text, and so does this loader.
	m, _ = c.Lookup("5", desc("day", "2026-12-14"), nil)
	if m.Limit == nil || m.Limit.RequestsPerUnit != 7 {
		t.Fatalf("timestamp-like value not matched as written: %+v", m.Limit)
	}
}

func TestDuplicateDomainRejected(t *testing.T) {
	_, err := Load([]File{{Name: "a.yaml", Data: []byte("domain: d\n")}, {Name: "b.yaml", Data: []byte("domain: d\n")}})
	if err == nil || !strings.Contains(err.Error(), "b.yaml: domain: duplicate domain 'd'") {
		t.Fatalf("err = %v", err)
	}
}

func TestLoadDirLayout(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	write := func(rel, s string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\n")
	write("sub/b.yaml", "domain: b\n")
	write(".hidden.yaml", "domain: hidden\n")
	write("..data/c.yaml", "domain: c\n")
	opts := DirOptions{Root: root, Subdirectory: "ratelimit", AppDirectory: "config", IgnoreDotFiles: true}
	c, err := LoadDir(opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Domains(), ","); got != "a,b" {
		t.Fatalf("domains = %s, want a,b", got)
	}
	opts.IgnoreDotFiles = false
	c, err = LoadDir(opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Domains(), ","); got != "a,b,c,hidden" {
		t.Fatalf("domains = %s, want a,b,c,hidden", got)
	}
	write("bad.yaml", "domain: x\nbogus: 1\n")
	if _, err := LoadDir(opts); err == nil || !strings.Contains(err.Error(), "bad.yaml:2:1: bogus: unknown key") {
		t.Fatalf("err = %v", err)
	}
}

func TestFromProto(t *testing.T) {
	c, err := FromProto([]*rlsconfv3.RateLimitConfig{{
		Name: "gw", Domain: "default/policy",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: "default/policy/rule/0", Value: "default/policy/rule/0", ShadowMode: true,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{
				Key:       "rule-0-match-0",
				RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 1000},
			}},
		}, {
			Key: "u", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := c.Lookup("default/policy", desc("default/policy/rule/0", "default/policy/rule/0", "rule-0-match-0", "alice"), nil)
	if m.Limit == nil || m.Limit.Divider != 86400 || m.Limit.RequestsPerUnit != 1000 || m.Limit.ShadowMode {
		t.Fatalf("proto limit: %+v", m.Limit)
	}
	m, _ = c.Lookup("default/policy", desc("u", "x"), nil)
	if m.Limit == nil || !m.Limit.Unlimited {
		t.Fatalf("unlimited proto limit: %+v", m.Limit)
	}
	_, err = FromProto([]*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d"}, {Name: "b", Domain: "d"}})
	if err == nil || !strings.Contains(err.Error(), "xds:b: domain: duplicate domain") {
		t.Fatalf("duplicate domain over xDS: %v", err)
	}
	_, err = FromProto([]*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{RequestsPerUnit: 1}}}}})
	if err == nil || !strings.Contains(err.Error(), "invalid rate limit unit 'UNKNOWN'") {
		t.Fatalf("missing unit over xDS: %v", err)
	}
}

func TestDumpSorted(t *testing.T) {
	c := mustLoad(t, sample)
	a, b := c.Dump(), c.Dump()
	if a != b || !strings.Contains(a, "mongo_cps.user: unit=DAY requests_per_unit=3") {
		t.Fatalf("dump:\n%s", a)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(sample))
	f.Add([]byte("domain: d\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: a\n    value: b*\n    share_threshold: true\n    rate_limit: {unit: day, requests_per_unit: 1}\n"))
	f.Add([]byte("domain: &a d\nx: *a\n"))
	f.Add([]byte("- [\n"))
	f.Add([]byte("name: [{key: 1}, {value: [a]}]\ndomain: d\ndescriptors:\n  - {key: k, value: 2026-12-14, rate_limit: {unit: day, requests_per_unit: 0x10, replaces: [{name: x}]}}\n"))
	f.Add([]byte("domain: d\ndescriptors: [~, {key: k, shadow_mode: yes, rate_limit: {requests_per_unit: 1.5}}]\n---\n["))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Load([]File{{Name: "f.yaml", Data: data}})
		if err != nil {
			var e *yamlpos.Error
			if !errors.As(err, &e) || e.File != "f.yaml" || e.Line > len(data)+1 { // a line ends in at least one byte
				t.Fatalf("error not a *yamlpos.Error in the file: %T %v", err, err)
			}
			return
		}
		for _, d := range c.Domains() {
			c.Lookup(d, desc("a", "b", "c", "d"), nil)
		}
		_ = c.Dump()
	})
}
