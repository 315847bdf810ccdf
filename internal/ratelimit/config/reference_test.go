package config

import (
	"fmt"
	"strings"
	"testing"

	refconfig "github.com/envoyproxy/ratelimit/src/config"
	refsettings "github.com/envoyproxy/ratelimit/src/settings"
	refstats "github.com/envoyproxy/ratelimit/src/stats"
	gostats "github.com/lyft/gostats"
)

// referenceCorpus holds config files of the shapes the reference's own
// tests use, valid and invalid; the key set, the levels and the value types
// vary one at a time.
var referenceCorpus = map[string]string{
	"plain":                   "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
	"eg ratelimitconfig name": "name: default/eg/http\ndomain: default/eg/http\ndescriptors:\n  - key: rule-0-match-0\n    value: rule-0-match-0\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
	"name on a descriptor":    "domain: d\ndescriptors:\n  - key: k\n    name: n\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
	"key in a rate_limit":     "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, key: x}\n",
	"unit on a descriptor":    "domain: d\ndescriptors:\n  - key: k\n    unit: day\n",
	"unit in replaces":        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, name: a}\n  - key: j\n    rate_limit: {unit: minute, requests_per_unit: 5, replaces: [{name: a, unit: x}]}\n",
	"top-level rate_limit":    "domain: d\nrate_limit: {unit: minute, requests_per_unit: 5}\n",
	"quota and metrics keys":  "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    detailed_metric: true\n    value_to_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
	"share_threshold":         "domain: d\ndescriptors:\n  - key: k\n    value: a*\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
	"unknown top key":         "domain: d\nfoo: bar\n",
	"unknown descriptor key":  "domain: d\ndescriptors:\n  - key: k\n    limit: 5\n",
	"metadata key":            "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: b}\n",
	"unknown under name":      "name: {foo: 1}\ndomain: d\n",
	"scalars list under name": "name: [a, b]\ndomain: d\n",
	"float under name":        "name: 1.5\ndomain: d\n",
	"float requests":          "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1.5}\n",
	"bad unit":                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n",
	"empty domain":            "name: x\ndescriptors:\n  - key: k\n",
	"unlimited with unit":     "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, unlimited: true}\n",
	"threshold no wildcard":   "domain: d\ndescriptors:\n  - key: k\n    value: a\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
	"duplicate descriptor":    "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
	"empty key":               "domain: d\ndescriptors:\n  - value: v\n",
	"non-string key":          "domain: d\n5: x\n",
	"timestamp-like value":    "domain: d\ndescriptors:\n  - key: day\n    value: 2026-12-14\n    rate_limit: {unit: day, requests_per_unit: 5}\n  - key: k\n    name: 2026-12-14\n",
}

// TestVerdictsMatchReference loads every file of the corpus with our
// loader and with the reference's src/config package, at the version
// test/reftest pins, and requires the same verdict: accepted by both or
// refused by both.
func TestVerdictsMatchReference(t *testing.T) {
	t.Setenv("USE_STATSD", "false")
	mgr := refstats.NewStatManager(gostats.NewStore(gostats.NewNullSink(), false), refsettings.NewSettings())
	refLoad := func(name, content string) (err error) {
		defer func() { // the reference reports config errors by panicking
			if r := recover(); r != nil {
				err = fmt.Errorf("%v", r)
			}
		}()
		root := refconfig.ConfigFileContentToYaml(name, content)
		refconfig.NewRateLimitConfigImpl([]refconfig.RateLimitConfigToLoad{{Name: name, ConfigYaml: root}}, mgr, false)
		return nil
	}
	accepted := 0
	for name, content := range referenceCorpus {
		t.Run(name, func(t *testing.T) {
			refErr := refLoad(name+".yaml", content)
			_, ourErr := Load([]File{{Name: name + ".yaml", Data: []byte(content)}})
			if (refErr == nil) != (ourErr == nil) {
				t.Errorf("reference: %v; ours: %v", refErr, ourErr)
			}
			if refErr == nil {
				accepted++
			}
		})
	}
	if accepted < 5 || accepted > len(referenceCorpus)-5 {
		t.Errorf("%d of %d files accepted: the corpus must hold both kinds", accepted, len(referenceCorpus))
	}
}

// Keys the reference gives a meaning that is not applied here are
// reported, each with its place.
func TestNotAppliedReported(t *testing.T) {
	c, err := Load([]File{{Name: "m.yaml", Data: []byte(referenceCorpus["quota and metrics keys"] + "  - key: w\n    value: a*b\n")}})
	if err != nil {
		t.Fatal(err)
	}
	got := c.NotApplied()
	want := []string{
		"m.yaml:5:22: descriptors[0].detailed_metric: accepted, not applied",
		"m.yaml:6:22: descriptors[0].value_to_metric: accepted, not applied",
		"m.yaml:9:12: descriptors[1].value: a '*' before the end is matched literally",
	}
	if len(got) != len(want) {
		t.Fatalf("got %q", got)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("got %q, want prefix %q", got[i], want[i])
		}
	}
	plain, _ := Load([]File{{Name: "p.yaml", Data: []byte(referenceCorpus["plain"])}})
	if n := plain.NotApplied(); len(n) != 0 {
		t.Errorf("plain config: %q", n)
	}
}
