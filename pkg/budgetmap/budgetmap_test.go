package budgetmap_test

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/budgetmap"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

var update = flag.Bool("update", false, "rewrite golden files")

func renderMap(t testing.TB, path string) []byte {
	t.Helper()
	bs, err := spec.LoadFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	data, err := budgetmap.Encode(render.BudgetMap(bs))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestRenderedMapGoldenAndRoundTrip(t *testing.T) {
	got := renderMap(t, "testdata/mixed-spec.yaml")
	if again := renderMap(t, "testdata/mixed-spec.yaml"); !bytes.Equal(got, again) {
		t.Fatal("two renders of one spec differ")
	}
	const golden = "testdata/mixed-map.golden.yaml"
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("budget map differs from %s (go test ./pkg/budgetmap -update):\n%s", golden, got)
	}
	m, err := budgetmap.Load(got, "map.yaml")
	if err != nil {
		t.Fatal(err)
	}
	re, err := budgetmap.Encode(m)
	if err != nil || !bytes.Equal(re, got) {
		t.Fatalf("load+encode is not the identity (err %v)", err)
	}
	// The same budget on two kinds of Gateway shares one bucket name only
	// when its Gateways are listed together; here each budget has one home.
	buckets := map[string]string{}
	for _, e := range m.Entries {
		if b, ok := buckets[e.Bucket]; ok && b != e.Budget {
			t.Errorf("bucket %s holds budgets %s and %s", e.Bucket, b, e.Budget)
		}
		buckets[e.Bucket] = e.Budget
	}
}

func TestSharedAndPerGatewayBuckets(t *testing.T) {
	doc := `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetSet
metadata: {name: s}
spec:
  gateways: [{namespace: a, name: gw1}, {namespace: b, name: gw2}]
  identities: {x-key: {apiKeyClientID: true}}
  budgets:
    - {name: shared, perPrincipal: x-key, tokensPerDay: 10}
    - {name: split, perPrincipal: x-key, tokensPerDay: 10, bucket: perGateway}
`
	bs, err := spec.Load([]byte(doc), "s.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, e := range render.BudgetMap(bs).Entries {
		got[e.Budget] = append(got[e.Budget], e.Bucket)
	}
	// Per Gateway two rules: the principals' and the unidentified requests'
	// (principal budgetgen/no-claim), both in the budget's bucket.
	want := map[string][]string{
		"shared": {"s/shared", "s/shared", "s/shared", "s/shared"},
		"split":  {"s/split@a/gw1", "s/split@a/gw1", "s/split@b/gw2", "s/split@b/gw2"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("buckets = %v, want %v", got, want)
	}
}

const valid = `apiVersion: budgetgen.dev/v1alpha1
kind: BudgetMap
budgetSet: s
entries:
  - domain: a/s-gw1
    descriptor: [{key: a/s-gw1/rule/0, value: a/s-gw1/rule/0}]
    gateway: {kind: envoy, namespace: a, name: gw1}
    budget: per-key
    bucket: s/per-key
    kind: tokens
    principal: {header: x-key}
    tokensPerDay: 10
    window: day
    mode: shadow
`

func TestLoadErrors(t *testing.T) {
	tests := []struct{ name, from, to, want string }{
		{"unknown field", "    window: day\n", "    windw: day\n", "m.yaml:13: entries[0].windw: unknown field, did you mean window? (known: domain, descriptor, gateway, budget, bucket, kind, principal, overridePrincipal, tokensPerDay, window, mode, measure, reserve)"},
		{"wrong type", "tokensPerDay: 10", "tokensPerDay: ten", `m.yaml:12: entries[0].tokensPerDay: must be an integer, got "ten"`},
		{"version", "budgetgen.dev/v1alpha1", "budgetgen.dev/v2", `m.yaml:1: apiVersion: must be budgetgen.dev/v1alpha1, got "budgetgen.dev/v2"`},
		{"bad kind", "kind: tokens", "kind: coins", `m.yaml:10: entries[0].kind: must be tokens or killswitch, got "coins"`},
		{"zero cap", "tokensPerDay: 10", "tokensPerDay: 0", "m.yaml:12: entries[0].tokensPerDay: must be > 0 for a token budget"},
		{"window", "window: day", `window: ""`, "m.yaml:13: entries[0].window: is required (day, or the window of the rule's limit)"},
		{"no descriptor", "    descriptor: [{key: a/s-gw1/rule/0, value: a/s-gw1/rule/0}]\n", "", "m.yaml:5: entries[0].descriptor: needs at least one level"},
		{"two principals", "principal: {header: x-key}", "principal: {header: x-key, expression: jwt.sub}", "m.yaml:11: entries[0].principal: set header or expression, not both"},
		{"gateway kind", "kind: envoy", "kind: nginx", `m.yaml:7: entries[0].gateway.kind: must be envoy or agentgateway, got "nginx"`},
		{"two documents", "mode: shadow\n", "mode: shadow\n---\na: 1\n", "m.yaml:15: more than one YAML document: a budget map file holds exactly one BudgetMap"},
		{"empty", valid, "", "m.yaml: empty document: expected a BudgetMap"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(valid, tc.from, tc.to, 1)
			m, err := budgetmap.Load([]byte(doc), "m.yaml")
			if err == nil || m != nil {
				t.Fatalf("Load = %v, %v; want an error", m, err)
			}
			if err.Error() != tc.want {
				t.Errorf("error:\n got %s\nwant %s", err, tc.want)
			}
			var e *yamlpos.Error
			if !errors.As(err, &e) {
				t.Errorf("error %T is no *yamlpos.Error", err)
			}
		})
	}
}

func TestLoadRejectsDuplicatesAndSharedBucketOfTwoBudgets(t *testing.T) {
	second := strings.SplitN(valid, "entries:\n", 2)[1]
	doc := valid + strings.Replace(second, "budget: per-key", "budget: other", 1)
	_, err := budgetmap.Load([]byte(doc), "m.yaml")
	want := "m.yaml:16: entries[1].descriptor: domain a/s-gw1 and this descriptor are already mapped by entries[0]\n" +
		`m.yaml:19: entries[1].bucket: bucket "s/per-key" already belongs to budget "per-key": one bucket counts one budget`
	if err == nil || err.Error() != want {
		t.Errorf("error:\n got %v\nwant %s", err, want)
	}
}

func TestIndexLongestPrefix(t *testing.T) {
	m, err := budgetmap.Load(renderMap(t, "testdata/mixed-spec.yaml"), "m.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ix := budgetmap.NewIndex(m)
	d := func(kv ...string) []budgetmap.DescriptorEntry {
		var out []budgetmap.DescriptorEntry
		for i := 0; i < len(kv); i += 2 {
			out = append(out, budgetmap.DescriptorEntry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	const agw = "agents/ai-budgets-agent-gw"
	if e := ix.Lookup(agw, d("budget", "per-run", "principal", "")); e == nil || e.OverridePrincipal != "" || e.TokensPerDay != 5000000 {
		t.Errorf("default per-run rule -> %+v", e)
	}
	if e := ix.Lookup(agw, d("budget", "per-run", "principal", "run-big")); e == nil || e.OverridePrincipal != "run-big" {
		t.Errorf("override rule -> %+v", e)
	}
	const eg = "ai-gateway/ai-budgets-agent-router"
	rule1 := eg + "/rule/1"
	if e := ix.Lookup(eg, d(rule1, rule1, "rule-1-match-0", "rule-1-match-0")); e == nil || e.OverridePrincipal != "acme-batch" {
		t.Errorf("EG override rule (prefix match) -> %+v", e)
	}
	if e := ix.Lookup(eg, d("budget", "per-run", "principal", "")); e != nil {
		t.Errorf("agentgateway path in the EG domain matched %+v", e)
	}
	if e := ix.Lookup(agw, d("budget", "nope", "principal", "")); e != nil {
		t.Errorf("unknown budget matched %+v", e)
	}
}

func TestParseBucket(t *testing.T) {
	for _, c := range []struct {
		in                            string
		set, budget, gateway, measure string
		ok                            bool
	}{
		{"s/b", "s", "b", "", "", true},
		{"s/b@ns/gw", "s", "b", "ns/gw", "", true},
		{"s/b@ns/gw#cost", "s", "b", "ns/gw", "cost", true},
		{budgetmap.MeasureBucket(budgetmap.BucketName("s", "b", ""), budgetmap.MeasureKiloTokens), "s", "b", "", "ktokens", true},
		{"s/frontier#killswitch", "s", "frontier", "", "killswitch", true},
		{"nobucket", "", "", "", "", false},
		{"/b", "", "", "", "", false},
	} {
		set, budget, gw, m, ok := budgetmap.ParseBucket(c.in)
		if set != c.set || budget != c.budget || gw != c.gateway || m != c.measure || ok != c.ok {
			t.Errorf("%q: %q %q %q %q %v", c.in, set, budget, gw, m, ok)
		}
	}
}

// FuzzParseBucket: any name either is refused or splits into parts that
// build it back.
func FuzzParseBucket(f *testing.F) {
	for _, s := range []string{"s/b", "s/b@ns/gw#cost", "s/frontier#killswitch", "a/b/c", "#", "/@#"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		set, budget, gw, m, ok := budgetmap.ParseBucket(s)
		if !ok {
			return
		}
		if set == "" || budget == "" || strings.Contains(budget, "/") {
			t.Fatalf("%q: set %q budget %q", s, set, budget)
		}
		back := set + "/" + budget
		before, _, hasMeasure := strings.Cut(s, "#")
		if strings.Contains(before, "@") {
			back += "@" + gw
		}
		if hasMeasure {
			back += "#" + m
		}
		if back != s {
			t.Fatalf("%q parses to %q %q %q %q, which builds %q", s, set, budget, gw, m, back)
		}
	})
}
