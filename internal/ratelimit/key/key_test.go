package key

import (
	"math/rand"
	"reflect"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

func entries(kv ...string) []*rlcommon.RateLimitDescriptor_Entry {
	var out []*rlcommon.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func TestEnvoyFormatMatchesReferenceLayout(t *testing.T) {
	e := Encoder{Prefix: "pfx:", Format: Envoy}
	got := string(e.Append(nil, "domain", entries("key", "value", "key2", "value2"), nil, 60, 1234))
	// cache_key.go: prefix + domain + "_" + (key + "_" + value + "_")* + windowStart
	if want := "pfx:domain_key_value_key2_value2_1234"; got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	got = string(e.Append(nil, "d", entries("k", "file1"), []string{"f*"}, 60, 0))
	if want := "pfx:d_k_f*_0"; got != want {
		t.Fatalf("share_threshold key: got %q want %q", got, want)
	}
}

func TestEnvoyFormatIsAmbiguousSafeIsNot(t *testing.T) {
	// The reason Safe is the default: these two descriptors share a counter in
	// the reference's format.
	a, b := entries("user", "a_b"), entries("user_a", "b")
	env := Encoder{Format: Envoy}
	if string(env.Append(nil, "d", a, nil, 1, 0)) != string(env.Append(nil, "d", b, nil, 1, 0)) {
		t.Fatal("expected the envoy format to collide on '_' in values")
	}
	safe := Encoder{}
	if string(safe.Append(nil, "d", a, nil, 1, 0)) == string(safe.Append(nil, "d", b, nil, 1, 0)) {
		t.Fatal("safe format collided")
	}
}

func TestParseFormat(t *testing.T) {
	for in, want := range map[string]Format{"": Safe, "safe": Safe, "envoy": Envoy} {
		if got, err := ParseFormat(in); err != nil || got != want {
			t.Errorf("ParseFormat(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseFormat("Envoy"); err == nil {
		t.Error("ParseFormat accepted an unknown name")
	}
}

type triple struct {
	domain  string
	kv      []string
	divider int64
	window  int64
}

func (tr triple) encode(prefix string) string {
	return string(Encoder{Prefix: prefix}.Append(nil, tr.domain, entries(tr.kv...), nil, tr.divider, tr.window))
}

// alphabet is small and full of separators so collisions would be found.
var alphabet = []string{"", "_", "a", "b", ":", "1", "@", "|", "0:", "1:", "_a", "a_", "é", "\x00"}

func randTriple(r *rand.Rand) triple {
	s := func() string {
		n := r.Intn(4)
		out := ""
		for i := 0; i < n; i++ {
			out += alphabet[r.Intn(len(alphabet))]
		}
		return out
	}
	tr := triple{domain: s(), divider: []int64{1, 60, 3600, 86400}[r.Intn(4)], window: int64(r.Intn(3)) * 60}
	for i := r.Intn(4); i > 0; i-- {
		tr.kv = append(tr.kv, s(), s())
	}
	return tr
}

func same(a, b triple) bool {
	if len(a.kv) == 0 && len(b.kv) == 0 {
		a.kv, b.kv = nil, nil
	}
	return reflect.DeepEqual(a, b)
}

func TestSafeNeverCollidesProperty(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	seen := map[string]triple{}
	for i := 0; i < 200000; i++ {
		tr := randTriple(r)
		k := tr.encode("p:")
		if prev, ok := seen[k]; ok && !same(prev, tr) {
			t.Fatalf("collision on %q: %+v vs %+v", k, prev, tr)
		}
		seen[k] = tr
		d, err := Decode("p:", k)
		if err != nil {
			t.Fatalf("decode %q: %v", k, err)
		}
		back := triple{domain: d.Domain, divider: d.Divider, window: d.WindowStart}
		for _, e := range d.Entries {
			back.kv = append(back.kv, e[0], e[1])
		}
		if !same(back, tr) {
			t.Fatalf("round trip of %q: %+v != %+v", k, back, tr)
		}
	}
	if len(seen) < 10000 {
		t.Fatalf("property test explored too little: %d distinct keys", len(seen))
	}
}

func FuzzSafeInjective(f *testing.F) {
	f.Add("d", "user", "a_b", "d", "user_a", "b", int64(60), int64(0))
	f.Add("d", "1:", "x", "d1", ":", "x", int64(1), int64(1))
	f.Fuzz(func(t *testing.T, d1, k1, v1, d2, k2, v2 string, div, ws int64) {
		a := triple{domain: d1, kv: []string{k1, v1}, divider: div, window: ws}
		b := triple{domain: d2, kv: []string{k2, v2}, divider: div, window: ws}
		if a.encode("") == b.encode("") && !same(a, b) {
			t.Fatalf("collision: %+v %+v", a, b)
		}
		if _, err := Decode("", a.encode("")); err != nil && div >= 0 && ws >= 0 {
			t.Fatalf("decode: %v", err)
		}
	})
}

func FuzzDecode(f *testing.F) {
	f.Add("bg1|1:d1:k1:v@60|120")
	f.Add("bg1|@1|1")
	f.Fuzz(func(t *testing.T, s string) {
		d, err := Decode("", s)
		if err != nil {
			return
		}
		kv := []string{}
		for _, e := range d.Entries {
			kv = append(kv, e[0], e[1])
		}
		if got := (triple{domain: d.Domain, kv: kv, divider: d.Divider, window: d.WindowStart}).encode(""); got != s {
			t.Fatalf("decode/encode not inverse: %q -> %q", s, got)
		}
	})
}

func BenchmarkAppend(b *testing.B) {
	es := entries("generic_key", "default/policy/rule/0", "rule-0-match-0", "alice@example.com")
	for _, f := range []Format{Safe, Envoy} {
		b.Run(f.String(), func(b *testing.B) {
			e := Encoder{Prefix: "rl:", Format: f}
			buf := make([]byte, 0, 256)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				buf = e.Append(buf[:0], "default/policy", es, nil, 86400, 1700000000)
			}
		})
	}
}

// TestLongValuesDigested: a value past MaxValueBytes is keyed by its
// digest, in both formats and in budget keys; two long values that differ
// anywhere get two counters; a short value that spells a digest never meets
// a long one (every format marks the digest apart); the key stays
// bounded; Decode gives the digest back.
func TestLongValuesDigested(t *testing.T) {
	long := strings.Repeat("v", MaxValueBytes+1)
	other := long[:len(long)-1] + "w"
	entry := func(v string) []*rlcommon.RateLimitDescriptor_Entry {
		return []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: v}}
	}
	for _, f := range []Format{Safe, Envoy} {
		e := Encoder{Prefix: "p_", Format: f}
		a := string(e.Append(nil, "d", entry(long), nil, 86400, 0))
		b := string(e.Append(nil, "d", entry(other), nil, 86400, 0))
		if a == b || len(a) > 200 || !strings.Contains(a, strings.TrimPrefix(Digest(long), "sha256:")) {
			t.Errorf("%v: keys %q and %q: want distinct digests under 200 bytes", f, a, b)
		}
		spelled := string(e.Append(nil, "d", entry(Digest(long)), nil, 86400, 0))
		if spelled == a {
			t.Errorf("%v: a short value spelling the digest shares the long value's key", f)
		}
		if again := string(e.Append(nil, "d", entry(strings.Clone(long)), nil, 86400, 0)); again != a {
			t.Errorf("%v: one long value, two keys: %q, %q", f, a, again)
		}
		if f == Safe {
			d, err := Decode("p_", a)
			if err != nil || d.Entries[0][1] != Digest(long) {
				t.Errorf("Decode(%q) = %+v, %v", a, d, err)
			}
		}
	}
	e := Encoder{}
	bl := string(e.AppendBudget(nil, "set/b", "", false, entry(long), 1, 86400, 0))
	bs := string(e.AppendBudget(nil, "set/b", "", false, entry(Digest(long)), 1, 86400, 0))
	if bl == bs || len(bl) > 200 {
		t.Errorf("budget keys %q, %q: want distinct and bounded", bl, bs)
	}
	if exact := strings.Repeat("v", MaxValueBytes); !strings.Contains(string(e.Append(nil, "d", entry(exact), nil, 86400, 0)), exact) {
		t.Error("a value of exactly MaxValueBytes must be kept as it is")
	}
}
