package rlsconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite golden files")

func loadPolicies(t testing.TB, path string) []*egv1a1.BackendTrafficPolicy {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []*egv1a1.BackendTrafficPolicy
	for _, doc := range strings.Split(string(data), "\n---\n") {
		p := &egv1a1.BackendTrafficPolicy{}
		if err := yaml.UnmarshalStrict([]byte(doc), p); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, p)
	}
	return out
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (run with -update after checking):\n--- got\n%s", path, got)
	}
}

func TestConfigsGolden(t *testing.T) {
	cfgs, err := Configs(loadPolicies(t, "testdata/policies.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var all bytes.Buffer
	for _, c := range cfgs {
		y, err := MarshalYAML(c)
		if err != nil {
			t.Fatal(err)
		}
		all.WriteString("# file " + FileName(c.Domain) + "\n")
		all.Write(y)
	}
	golden(t, "configs.golden.yaml", all.Bytes())

	// Spot checks that do not depend on the golden file.
	if len(cfgs) != 2 || cfgs[0].Domain != "edge/selectors" || cfgs[1].Domain != "llm/budgets" {
		t.Fatalf("domains = %v", domains(cfgs))
	}
	b := cfgs[1]
	if b.Name != b.Domain {
		t.Errorf("name %q != domain %q", b.Name, b.Domain)
	}
	r0 := b.Descriptors[0]
	if r0.Key != "llm/budgets/rule/0" || r0.Value != r0.Key || r0.ShadowMode {
		t.Errorf("rule descriptor = %v", r0)
	}
	leaf := r0.Descriptors[0]
	if leaf.Key != "rule-0-match-0" || leaf.Value != "" || !leaf.ShadowMode || leaf.RateLimit.GetUnit() != rlsconfv3.RateLimitUnit_DAY || leaf.RateLimit.GetRequestsPerUnit() != 200000 {
		t.Errorf("distinct leaf = %v", leaf)
	}
	// Exact then Distinct: rule-1-match-0 = value, then rule-1-match-1 any value.
	m0 := b.Descriptors[1].Descriptors[0]
	if m0.Key != "rule-1-match-0" || m0.Value != "rule-1-match-0" || m0.RateLimit != nil || m0.ShadowMode {
		t.Errorf("exact level = %v", m0)
	}
	if m1 := m0.Descriptors[0]; m1.Key != "rule-1-match-1" || m1.Value != "" || m1.RateLimit.GetRequestsPerUnit() != 1000000 {
		t.Errorf("distinct level = %v", m1)
	}
	// Kill switch: limit 0 is kept.
	if k := b.Descriptors[2].Descriptors[0]; k.RateLimit == nil || k.RateLimit.RequestsPerUnit != 0 {
		t.Errorf("kill switch = %v", k)
	}
	// Inverted regex header: same config as a plain one.
	if inv := b.Descriptors[3].Descriptors[0]; inv.Key != "rule-3-match-0" || inv.Value != inv.Key {
		t.Errorf("inverted = %v", inv)
	}
}

func domains(cfgs []*rlsconfv3.RateLimitConfig) []string {
	var out []string
	for _, c := range cfgs {
		out = append(out, c.Domain)
	}
	return out
}

func TestRouteRateLimitsGolden(t *testing.T) {
	var buf bytes.Buffer
	for _, p := range loadPolicies(t, "testdata/policies.yaml") {
		rls, err := RouteRateLimits(p)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for d := range rls {
			keys = append(keys, d)
		}
		sort.Strings(keys)
		for _, d := range keys {
			for i, rl := range rls[d] {
				j, err := protojson.Marshal(rl)
				if err != nil {
					t.Fatal(err)
				}
				var out bytes.Buffer
				if err := json.Indent(&out, compact(t, j), "", "  "); err != nil {
					t.Fatal(err)
				}
				buf.WriteString("# " + d + " rate_limits[" + strconv.Itoa(i) + "]\n")
				buf.Write(out.Bytes())
				buf.WriteByte('\n')
			}
		}
	}
	golden(t, "route_rate_limits.golden.json", buf.Bytes())
}

// compact removes protojson's deliberately unstable whitespace.
func compact(t *testing.T, j []byte) []byte {
	var out bytes.Buffer
	if err := json.Compact(&out, j); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func TestResponseCostAddsNoConfig(t *testing.T) {
	p := loadPolicies(t, "testdata/policies.yaml")[0]
	with, err := Configs([]*egv1a1.BackendTrafficPolicy{p})
	if err != nil {
		t.Fatal(err)
	}
	q := p.DeepCopy()
	for i := range q.Spec.RateLimit.Global.Rules {
		q.Spec.RateLimit.Global.Rules[i].Cost = nil
	}
	without, err := Configs([]*egv1a1.BackendTrafficPolicy{q})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(with[0], without[0]) {
		t.Error("costs changed the service config")
	}
	rls, err := RouteRateLimits(p)
	if err != nil {
		t.Fatal(err)
	}
	// Rules 0 and 1 have a response cost: two rate_limits each; 2 and 3 one.
	got := rls["llm/budgets"]
	if len(got) != 6 {
		t.Fatalf("rate_limits = %d, want 6", len(got))
	}
	if got[0].ApplyOnStreamDone || !got[1].ApplyOnStreamDone || got[1].HitsAddend.GetFormat() != "%DYNAMIC_METADATA(io.envoy.ai_gateway:llm_total_token)%" {
		t.Errorf("response cost rate_limit = %v", got[1])
	}
	if got[0].HitsAddend.GetNumber() == nil || got[0].HitsAddend.GetNumber().Value != 0 {
		t.Errorf("request cost = %v, want number 0", got[0].HitsAddend)
	}
}

type entry = [2]string

func descs(calls []*rlsv3.RateLimitRequest) map[string][][]entry {
	out := map[string][][]entry{}
	for _, c := range calls {
		for _, d := range c.Descriptors {
			var es []entry
			for _, e := range d.Entries {
				es = append(es, entry{e.Key, e.Value})
			}
			out[c.Domain] = append(out[c.Domain], es)
		}
	}
	return out
}

func TestRequestsBudgets(t *testing.T) {
	p := loadPolicies(t, "testdata/policies.yaml")[0]
	rls, err := RouteRateLimits(p)
	if err != nil {
		t.Fatal(err)
	}
	req := Request{
		Headers: map[string]string{
			":method": "POST", ":path": "/v1/chat/completions",
			"X-User": "alice", "x-team": "fleet-a", "x-api-key-id": "k1", "x-ai-eg-model": "gpt-5-mini", "x-run-id": "r1",
		},
		Metadata: map[string]string{"io.envoy.ai_gateway:llm_total_token": "1234"},
	}
	calls, err := Requests(rls, req, PhaseRequest)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || calls[0].Domain != "llm/budgets" || calls[0].HitsAddend != 0 {
		t.Fatalf("calls = %v", calls)
	}
	want := [][]entry{
		{{"llm/budgets/rule/0", "llm/budgets/rule/0"}, {"rule-0-match-0", "alice"}},
		{{"llm/budgets/rule/1", "llm/budgets/rule/1"}, {"rule-1-match-0", "rule-1-match-0"}, {"rule-1-match-1", "k1"}},
		{{"llm/budgets/rule/2", "llm/budgets/rule/2"}, {"rule-2-match-0", "rule-2-match-0"}},
	}
	if got := descs(calls)["llm/budgets"]; !equalEntries(got, want) {
		t.Errorf("request descriptors = %v, want %v", got, want)
	}
	d := calls[0].Descriptors
	if d[0].HitsAddend == nil || d[0].HitsAddend.Value != 0 || d[1].HitsAddend.GetValue() != 0 || d[2].HitsAddend != nil {
		t.Errorf("hits_addend = %v %v %v, want 0, 0, unset", d[0].HitsAddend, d[1].HitsAddend, d[2].HitsAddend)
	}

	done, err := Requests(rls, req, PhaseStreamDone)
	if err != nil {
		t.Fatal(err)
	}
	want = want[:2]
	if got := descs(done)["llm/budgets"]; !equalEntries(got, want) {
		t.Errorf("stream-done descriptors = %v, want %v", got, want)
	}
	for _, d := range done[0].Descriptors {
		if d.HitsAddend.GetValue() != 1234 {
			t.Errorf("stream-done hits_addend = %v, want 1234", d.HitsAddend)
		}
	}

	// Another team, no run id, non-frontier model: rule 1 does not apply, the
	// inverted rule 3 does (header absent never matches, so invert counts it).
	req.Headers = map[string]string{"x-user": "bob", "x-team": "fleet-b", "x-api-key-id": "k2", "x-ai-eg-model": "gpt-4o-mini"}
	calls, err = Requests(rls, req, PhaseRequest)
	if err != nil {
		t.Fatal(err)
	}
	want = [][]entry{
		{{"llm/budgets/rule/0", "llm/budgets/rule/0"}, {"rule-0-match-0", "bob"}},
		{{"llm/budgets/rule/3", "llm/budgets/rule/3"}, {"rule-3-match-0", "rule-3-match-0"}},
	}
	if got := descs(calls)["llm/budgets"]; !equalEntries(got, want) {
		t.Errorf("descriptors = %v, want %v", got, want)
	}
	// Missing token metadata: Envoy ignores the stream-done descriptors.
	req.Metadata = map[string]string{"io.envoy.ai_gateway:llm_total_token": "not-a-number"}
	done, err = Requests(rls, req, PhaseStreamDone)
	if err != nil || len(done) != 0 {
		t.Errorf("stream-done without a number = %v, %v; want no call", done, err)
	}
	// The regex is a full match: a prefix alone does not trigger the kill switch.
	req.Headers = map[string]string{"x-ai-eg-model": "my-gpt-5", "x-run-id": "r"}
	calls, _ = Requests(rls, req, PhaseRequest)
	if len(calls) != 0 {
		t.Errorf("calls = %v, want none", calls)
	}
}

func TestRequestsSelectors(t *testing.T) {
	p := loadPolicies(t, "testdata/policies.yaml")[1]
	rls, err := RouteRateLimits(p)
	if err != nil {
		t.Fatal(err)
	}
	req := Request{
		Headers:       map[string]string{":method": "PUT", ":path": "/v1/chat/x?tenant=t1&a=b", "x-tier": "free"},
		RemoteAddress: netip.MustParseAddr("10.1.200.7"),
	}
	calls, err := Requests(rls, req, PhaseRequest)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]entry{
		// POST's rate_limit does not match; PUT's does: same descriptor either way.
		{{"edge/selectors/rule/0", "edge/selectors/rule/0"}, {"rule-0-method", "rule-0-method"}, {"rule-0-path", "rule-0-path"}, {"rule-0-match-0", "t1"}},
		{{"edge/selectors/rule/1", "edge/selectors/rule/1"}, {"rule-1-match-0", "rule-1-match-0"}, {"masked_remote_address", "10.1.0.0/16"}, {"remote_address", "10.1.200.7"}},
		{{"edge/selectors/rule/2", "edge/selectors/rule/2"}, {"rule-2-match--1", "rule-2-match--1"}},
	}
	if got := descs(calls)["edge/selectors"]; !equalEntries(got, want) {
		t.Errorf("descriptors = %v\nwant %v", got, want)
	}
	// Path-separated prefix: /v1/chatty is not under /v1/chat/.
	req.Headers[":path"] = "/v1/chatty?tenant=t1"
	req.RemoteAddress = netip.MustParseAddr("10.2.0.1")
	calls, _ = Requests(rls, req, PhaseRequest)
	want = [][]entry{{{"edge/selectors/rule/2", "edge/selectors/rule/2"}, {"rule-2-match--1", "rule-2-match--1"}}}
	if got := descs(calls)["edge/selectors"]; !equalEntries(got, want) {
		t.Errorf("descriptors = %v\nwant %v", got, want)
	}
}

// Every descriptor Envoy would send must land on a limit in the config: walk
// the config as the reference does (key_value, then key) to a rate_limit at
// the descriptor's depth.
func TestDescriptorsHitConfiguredLimits(t *testing.T) {
	policies := loadPolicies(t, "testdata/policies.yaml")
	cfgs, err := Configs(policies)
	if err != nil {
		t.Fatal(err)
	}
	byDomain := map[string]*rlsconfv3.RateLimitConfig{}
	for _, c := range cfgs {
		byDomain[c.Domain] = c
	}
	reqs := []Request{
		{Headers: map[string]string{"x-user": "u", "x-team": "fleet-a", "x-api-key-id": "k", "x-ai-eg-model": "claude-opus-4"}, Metadata: map[string]string{"io.envoy.ai_gateway:llm_total_token": "7"}},
		{Headers: map[string]string{":method": "POST", ":path": "/v1/chat/a?tenant=z", "x-tier": "free"}, RemoteAddress: netip.MustParseAddr("10.1.0.9")},
	}
	n := 0
	for _, p := range policies {
		rls, _ := RouteRateLimits(p)
		for _, r := range reqs {
			for _, phase := range []Phase{PhaseRequest, PhaseStreamDone} {
				calls, err := Requests(rls, r, phase)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range calls {
					for _, d := range c.Descriptors {
						if lookup(byDomain[c.Domain].GetDescriptors(), d.Entries) == nil {
							t.Errorf("%s: no limit for %v", c.Domain, d.Entries)
						}
						n++
					}
				}
			}
		}
	}
	if n < 8 {
		t.Errorf("only %d descriptors checked", n)
	}
}

func lookup(ds []*rlsconfv3.RateLimitDescriptor, entries []*rlcommonv3.RateLimitDescriptor_Entry) *rlsconfv3.RateLimitPolicy {
	var cur *rlsconfv3.RateLimitDescriptor
	for _, e := range entries {
		var next *rlsconfv3.RateLimitDescriptor
		for _, d := range ds {
			if d.Key == e.Key && d.Value == e.Value {
				next = d
				break
			}
		}
		if next == nil {
			for _, d := range ds {
				if d.Key == e.Key && d.Value == "" {
					next = d
					break
				}
			}
		}
		if next == nil {
			return nil
		}
		cur, ds = next, next.Descriptors
	}
	if cur == nil {
		return nil
	}
	return cur.RateLimit
}

func equalEntries(a, b [][]entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				return false
			}
		}
	}
	return true
}

func TestErrors(t *testing.T) {
	base := loadPolicies(t, "testdata/policies.yaml")[0]
	cases := []struct {
		name string
		mod  func(*egv1a1.BackendTrafficPolicy)
		want string
	}{
		{"not shared", func(p *egv1a1.BackendTrafficPolicy) { p.Spec.RateLimit.Global.Rules[1].Shared = nil }, "rules[1]: rule is not shared"},
		{"distinct with value", func(p *egv1a1.BackendTrafficPolicy) {
			p.Spec.RateLimit.Global.Rules[0].ClientSelectors[0].Headers[0].Value = ptr("x")
		}, "rules[0]: clientSelectors[0].headers[0]"},
		{"distinct inverted", func(p *egv1a1.BackendTrafficPolicy) {
			p.Spec.RateLimit.Global.Rules[0].ClientSelectors[0].Headers[0].Invert = ptr(true)
		}, "invert is not applicable"},
		{"bad regex", func(p *egv1a1.BackendTrafficPolicy) {
			p.Spec.RateLimit.Global.Rules[2].ClientSelectors[0].Headers[0].Value = ptr("(")
		}, "rules[2]: clientSelectors[0].headers[0]: regex"},
		{"empty selector", func(p *egv1a1.BackendTrafficPolicy) {
			p.Spec.RateLimit.Global.Rules[0].ClientSelectors = append(p.Spec.RateLimit.Global.Rules[0].ClientSelectors, egv1a1.RateLimitSelectCondition{})
		}, "clientSelectors[1]: at least one"},
		{"bad unit", func(p *egv1a1.BackendTrafficPolicy) { p.Spec.RateLimit.Global.Rules[3].Limit.Unit = "Fortnight" }, `rules[3]: limit.unit: unknown unit "Fortnight"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := base.DeepCopy()
			c.mod(p)
			_, err := Configs([]*egv1a1.BackendTrafficPolicy{p})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "BackendTrafficPolicy llm/budgets") {
				t.Errorf("err = %v, want it to name the policy and contain %q", err, c.want)
			}
		})
	}
	p := base.DeepCopy()
	p.Spec.RateLimit.Global.Rules[0].Shared = ptr(false)
	if _, err := Configs([]*egv1a1.BackendTrafficPolicy{p}); !errors.Is(err, ErrNotShared) {
		t.Errorf("err = %v, want ErrNotShared", err)
	}
	if _, err := Configs([]*egv1a1.BackendTrafficPolicy{base, base}); err == nil {
		t.Error("a policy listed twice was accepted")
	}
}

func TestWriteDir(t *testing.T) {
	cfgs, err := Configs(loadPolicies(t, "testdata/policies.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(dir, "hand-written.yaml")
	if err := os.WriteFile(mine, []byte("domain: other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteDir(dir, cfgs); err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		entries, _ := os.ReadDir(dir)
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	if got := strings.Join(names(), ","); got != "edge_selectors.yaml,hand-written.yaml,llm_budgets.yaml" {
		t.Fatalf("dir holds %s (temporary files left?)", got)
	}
	for _, c := range cfgs {
		got, _ := os.ReadFile(filepath.Join(dir, FileName(c.Domain)))
		want, _ := MarshalYAML(c)
		if !bytes.Equal(got, append([]byte(GeneratedHeader), want...)) || !IsGenerated(got) {
			t.Errorf("%s: wrong content", c.Domain)
		}
	}
	// A file an earlier version wrote (its header said Envoy Gateway derives
	// every file) is still ours: removed when its domain is gone.
	legacy := filepath.Join(dir, "old_version.yaml")
	if err := os.WriteFile(legacy, []byte(legacyHeader+"domain: old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A domain that disappears loses its file; files budgetgen did not write stay.
	if err := WriteDir(dir, cfgs[1:]); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(names(), ","); got != "hand-written.yaml,llm_budgets.yaml" {
		t.Errorf("after dropping a domain the dir holds %s", got)
	}

	// A config that cannot be written makes the whole call write nothing.
	empty := filepath.Join(t.TempDir(), "new")
	bad := []*rlsconfv3.RateLimitConfig{cfgs[0], {Domain: "x", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: ""}}}}
	if err := WriteDir(empty, bad); err == nil || !strings.Contains(err.Error(), "domain x: descriptors[0]: descriptor without a key") {
		t.Errorf("err = %v", err)
	}
	clash := []*rlsconfv3.RateLimitConfig{{Domain: "a/b"}, {Domain: "a_b"}}
	if err := WriteDir(empty, clash); err == nil {
		t.Error("two domains written to one file")
	}
	if _, err := os.Stat(empty); !os.IsNotExist(err) {
		t.Errorf("a failed write created %s", empty)
	}
}

func TestFileName(t *testing.T) {
	for in, want := range map[string]string{"llm/budgets": "llm_budgets.yaml", "a.b/c-d": "a.b_c-d.yaml", "../x": "_._x.yaml", "é": "_.yaml"} {
		if got := FileName(in); got != want {
			t.Errorf("FileName(%q) = %q, want %q", in, got, want)
		}
	}
}
