package rlsconfig

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"testing"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	refconfig "github.com/envoyproxy/ratelimit/src/config"
	refsettings "github.com/envoyproxy/ratelimit/src/settings"
	refstats "github.com/envoyproxy/ratelimit/src/stats"
	gostats "github.com/lyft/gostats"
	"gopkg.in/yaml.v3"
)

// TestReferenceServiceAgrees loads the YAML files we write with
// envoyproxy/ratelimit's own config package (the service Envoy Gateway deploys)
// and asks it, for every descriptor our Envoy simulation produces, which limit
// applies: it must find one, with the unit, requests_per_unit and shadow mode of
// the rule the descriptor came from. It also checks that EG's own conversion of
// the proto (ConfigXdsProtoToYaml, used on the xDS path) loads to the same limits.
func TestReferenceServiceAgrees(t *testing.T) {
	policies := loadPolicies(t, "testdata/policies.yaml")
	cfgs, err := Configs(policies)
	if err != nil {
		t.Fatal(err)
	}
	var fromFiles, fromXDS []refconfig.RateLimitConfigToLoad
	for _, c := range cfgs {
		data, err := MarshalYAML(c)
		if err != nil {
			t.Fatal(err)
		}
		var root refconfig.YamlRoot
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true) // the reference rejects unknown keys too
		if err := dec.Decode(&root); err != nil {
			t.Fatalf("%s: %v", c.Domain, err)
		}
		fromFiles = append(fromFiles, refconfig.RateLimitConfigToLoad{Name: FileName(c.Domain), ConfigYaml: &root})
		fromXDS = append(fromXDS, refconfig.RateLimitConfigToLoad{Name: c.Name, ConfigYaml: refconfig.ConfigXdsProtoToYaml(c)})
	}
	t.Setenv("USE_STATSD", "false")
	mgr := refstats.NewStatManager(gostats.NewStore(gostats.NewNullSink(), false), refsettings.NewSettings())
	load := func(in []refconfig.RateLimitConfigToLoad) (c refconfig.RateLimitConfig, err error) {
		defer func() { // the reference reports config errors by panicking
			if r := recover(); r != nil {
				err = fmt.Errorf("reference rejected the config: %v", r)
			}
		}()
		return refconfig.NewRateLimitConfigImpl(in, mgr, false), nil
	}
	ref, err := load(fromFiles)
	if err != nil {
		t.Fatal(err)
	}
	refXDS, err := load(fromXDS)
	if err != nil {
		t.Fatal(err)
	}

	type want struct {
		unit   string
		rpu    uint32
		shadow bool
	}
	cases := []struct {
		req  Request
		want map[string]want // by the rule descriptor value
	}{
		{
			Request{
				Headers:  map[string]string{"x-user": "alice", "x-team": "fleet-a", "x-api-key-id": "k_1", "x-ai-eg-model": "claude-opus-4"},
				Metadata: map[string]string{"io.envoy.ai_gateway:llm_total_token": "99"},
			},
			map[string]want{
				"llm/budgets/rule/0":    {"DAY", 200000, true},
				"llm/budgets/rule/1":    {"DAY", 1000000, false},
				"llm/budgets/rule/2":    {"DAY", 0, false},
				"llm/budgets/rule/3":    {"HOUR", 50, false},
				"edge/selectors/rule/2": {"WEEK", 1000, true}, // no selector: every request
			},
		},
		{
			Request{
				Headers:       map[string]string{":method": "POST", ":path": "/v1/chat/a?tenant=z", "x-tier": "free"},
				RemoteAddress: netip.MustParseAddr("10.1.0.9"),
			},
			map[string]want{
				"edge/selectors/rule/0": {"MINUTE", 10, false},
				"edge/selectors/rule/1": {"SECOND", 5, false},
				"edge/selectors/rule/2": {"WEEK", 1000, true},
				"llm/budgets/rule/3":    {"HOUR", 50, false}, // inverted: no x-run-id header
			},
		},
	}
	for i, c := range cases {
		seen := map[string]bool{}
		for _, p := range policies {
			rls, err := RouteRateLimits(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, phase := range []Phase{PhaseRequest, PhaseStreamDone} {
				calls, err := Requests(rls, c.req, phase)
				if err != nil {
					t.Fatal(err)
				}
				for _, call := range calls {
					for _, d := range call.Descriptors {
						rule := d.Entries[0].Value
						w, ok := c.want[rule]
						if !ok {
							t.Errorf("case %d: unexpected descriptor %v", i, d.Entries)
							continue
						}
						seen[rule] = true
						for name, cfg := range map[string]refconfig.RateLimitConfig{"files": ref, "xds": refXDS} {
							got := cfg.GetLimit(context.Background(), call.Domain, &rlcommonv3.RateLimitDescriptor{Entries: d.Entries})
							if got == nil {
								t.Errorf("case %d (%s): reference finds no limit for %s %v", i, name, call.Domain, d.Entries)
								continue
							}
							if got.Limit.Unit.String() != w.unit || got.Limit.RequestsPerUnit != w.rpu || got.ShadowMode != w.shadow {
								t.Errorf("case %d (%s): %v -> %v %d shadow=%v, want %+v", i, name, d.Entries, got.Limit.Unit, got.Limit.RequestsPerUnit, got.ShadowMode, w)
							}
						}
					}
				}
			}
		}
		for rule := range c.want {
			if !seen[rule] {
				t.Errorf("case %d: no descriptor for %s", i, rule)
			}
		}
	}
}
