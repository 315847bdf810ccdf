package ledger

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"
	_ "time/tzdata"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	rlkey "github.com/budgetgen/budgetgen/internal/ratelimit/key"

	"github.com/budgetgen/budgetgen/internal/store"
)

func TestEncodePrincipalInjective(t *testing.T) {
	long := DigestPart(strings.Repeat("x", 9000))
	cases := [][]string{nil, {""}, {"", ""}, {"a"}, {"a", "b"}, {"a,b"}, {`a\`, "b"}, {`a`, `\b`}, {"a", ""}, {"", "a"}, {`\e`}, {"e"}, {`,`}, {`\`},
		{long}, {long[1:]}, {`\#` + long[1:]}, {long, "a"}, {"", long}, {long[:20]}, {long + "x"}}
	seen := map[string][]string{}
	for _, p := range cases {
		f := EncodePrincipal(p)
		if prev, dup := seen[f]; dup {
			t.Fatalf("%q and %q share field %q", prev, p, f)
		}
		seen[f] = p
		back, err := DecodePrincipal(f)
		if err != nil || !reflect.DeepEqual(back, p) && (len(back) != 0 || len(p) != 0) {
			t.Fatalf("decode(encode(%q)) = %q, %v (field %q)", p, back, err, f)
		}
	}
	if got := EncodePrincipal([]string{"alice@example.com"}); got != "alice@example.com" {
		t.Errorf("a plain principal is stored as itself, got %q", got)
	}
	if got := PrincipalName(EncodePrincipal([]string{"a,b", "c"})); got != "a,b, c" {
		t.Errorf("name %q", got)
	}
}

func FuzzPrincipalRoundTrip(f *testing.F) {
	f.Add("a", "b", 2)
	f.Add("", "x,y", 1)
	f.Add(`\e`, `\\`, 2)
	f.Add(DigestPart("x"), `\#sha256:`, 2)
	f.Fuzz(func(t *testing.T, a, b string, n int) {
		var parts []string
		switch ((n % 3) + 3) % 3 {
		case 1:
			parts = []string{a}
		case 2:
			parts = []string{a, b}
		}
		fld := EncodePrincipal(parts)
		back, err := DecodePrincipal(fld)
		if err != nil || len(back) != len(parts) {
			t.Fatalf("round trip %q -> %q -> %q %v", parts, fld, back, err)
		}
		for i := range back {
			if back[i] != parts[i] {
				t.Fatalf("round trip %q -> %q -> %q", parts, fld, back)
			}
		}
		// Any decodable field re-encodes to itself: one field per principal.
		if p2, err := DecodePrincipal(a); err == nil && EncodePrincipal(p2) != a {
			t.Fatalf("field %q decodes to %q which encodes to %q", a, p2, EncodePrincipal(p2))
		}
	})
}

func TestKeysRoundTripAndNeverCollide(t *testing.T) {
	d := DayOf(time.Date(2026, 10, 17, 13, 0, 0, 0, time.UTC))
	rules := []RuleID{
		{"ai-gateway/ai-budgets-agent-router", "ai-gateway/ai-budgets-agent-router/rule/0"},
		{"a|b", "c"}, {"a", "b|c"}, {"a}:x", "y"}, {"a", "}:20261017:u"}, {"", ""}, {"%41", "A"}, {"A", "A"}, {"é", "{x}"},
	}
	seen := map[string]RuleID{}
	for _, r := range rules {
		k := UsageKey("rl_", r, d)
		if prev, dup := seen[k]; dup {
			t.Fatalf("%v and %v share key %q", prev, r, k)
		}
		seen[k] = r
		got, gd, kind, err := ParseKey("rl_", k)
		if err != nil || got != r || gd != DayWindow(d) || kind != "u" {
			t.Fatalf("ParseKey(%q) = %v %v %q %v, want %v", k, got, gd, kind, err, r)
		}
		if _, _, kind, _ := ParseKey("rl_", StatsKey("rl_", r, d)); kind != "d" {
			t.Fatalf("stats key kind %q", kind)
		}
	}
	if k := UsageKey("", rules[0], d); k != "ledger:{ai-gateway/ai-budgets-agent-router|ai-gateway/ai-budgets-agent-router/rule/0}:20261017:u" {
		t.Errorf("Envoy Gateway rule keys stay readable, got %q", k)
	}
	for _, bad := range []string{"x", "ledger:{a|b}:2026101:u", "ledger:{a|b}:20261017:x", "ledger:{ab}:20261017:u", "ledger:{a%zz|b}:20261017:u", "ledger:{a%41|b}:20261017:u", "ledger:{a b|c}:20261017:u",
		"ledger:{a|b}:w20261017:u", "ledger:{a|b}:h2026101724:u", "ledger:{a|b}:m202613:u", "ledger:{a|b}:h202610171:u", "ledger:{a|b}:x20261017:u", "ledger:{a|b}::u"} {
		if _, _, _, err := ParseKey("", bad); !errors.Is(err, ErrNotLedgerKey) {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
}

func FuzzKeyRoundTrip(f *testing.F) {
	f.Add("ns/policy", "ns/policy/rule/3", int64(1_790_000_000), uint8(2))
	f.Add("a|b}{", "%", int64(0), uint8(4))
	f.Fuzz(func(t *testing.T, dom, rule string, at int64, period uint8) {
		if at < 0 || at > 100_000_000_000 || period < 1 || period > 4 {
			return
		}
		r := RuleID{dom, rule}
		w := WindowAt(Period(period), time.Unix(at, 0), nil)
		k := WindowUsageKey("p:", r, w)
		got, gw, _, err := ParseKey("p:", k)
		if err != nil || got != r || gw != w {
			t.Fatalf("%q: got %v %v %v, want %v", k, got, gw, err, w)
		}
	})
}

// FuzzParseKey: any string either is refused or names a key that encodes
// back to itself.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"ledger:{a|b}:20261017:u", "ledger:{a|b}:h2026101714:d", "ledger:{a|b}:w20261019:u", "ledger:{a|b}:m202610:u", "ledger:{a%7C|b}::u"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, k string) {
		r, w, kind, err := ParseKey("", k)
		if err != nil {
			return
		}
		back := WindowUsageKey("", r, w)
		if kind == "d" {
			back = WindowStatsKey("", r, w)
		}
		if back != k {
			t.Fatalf("%q parses to %v %v %s, which encodes to %q", k, r, w, kind, back)
		}
	})
}

func TestRetentionBounds(t *testing.T) {
	for _, tc := range []struct {
		in, want int
		ok       bool
	}{{0, DefaultRetentionDays, true}, {8, 8, true}, {7, 0, false}, {92, 92, true}, {93, 0, false}, {-1, 0, false}} {
		o := Options{RetentionDays: tc.in}
		err := o.Validate()
		if (err == nil) != tc.ok || tc.ok && o.RetentionDays != tc.want {
			t.Errorf("retention %d: %v %d", tc.in, err, o.RetentionDays)
		}
	}
}

type failingSink struct{ err error }

func (f failingSink) Apply(context.Context, Batch) error { return f.err }

func TestRecorderWithMemory(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 10, 17, 23, 59, 59, 0, time.UTC)
	clock := func() time.Time { return now }
	mem := NewMemory("p_", clock)
	rec, err := NewRecorder(Options{Prefix: "p_"}, mem, clock)
	if err != nil {
		t.Fatal(err)
	}
	r0 := RuleID{"ns/pol", "ns/pol/rule/0"}
	add := func(principal string, n uint64) {
		u := rec.Usage(r0, principal, now, n)
		mem.HIncrBy(u.Key, u.Field, u.Tokens)
	}
	add("alice", 100)
	add("bob", 5)
	add("alice", 50)
	rec.Defer(rec.Usage(r0, "bob", now, 20)) // answered from the over-limit cache
	rec.Denied(r0, now, true)
	rec.Denied(r0, now, true)
	now = now.Add(time.Second) // next UTC day
	add("alice", 7)
	rec.Denied(r0, now, false)
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	d1 := DayOf(time.Date(2026, 10, 17, 0, 0, 0, 0, time.UTC))
	keys, _ := mem.Keys(ctx, []Window{DayWindow(d1)})
	if len(keys) != 1 || keys[0] != (Key{r0, DayWindow(d1)}) {
		t.Fatalf("keys %v", keys)
	}
	got, _ := mem.Read(ctx, r0, DayWindow(d1))
	if got.Usage["alice"] != 150 || got.Usage["bob"] != 25 || got.Denials != (Denials{Shadow: 2}) {
		t.Fatalf("day 1: %+v", got)
	}
	got2, _ := mem.Read(ctx, r0, DayWindow(d1+1))
	if got2.Usage["alice"] != 7 || got2.Denials != (Denials{Enforce: 1}) {
		t.Fatalf("day 2: %+v", got2)
	}
	// Absolute expiry: the end of the day plus the retention.
	if exp := mem.TTL(UsageKey("p_", r0, d1)); !exp.Equal(time.Date(2026, 10, 28, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("expiry %v", exp)
	}
	// After the retention the day is gone, the next one not yet.
	now = time.Date(2026, 10, 28, 0, 0, 0, 0, time.UTC)
	if got, _ := mem.Read(ctx, r0, DayWindow(d1)); len(got.Usage) != 0 {
		t.Fatalf("expired day still read: %+v", got)
	}
	if got, _ := mem.Read(ctx, r0, DayWindow(d1+1)); got.Usage["alice"] != 7 {
		t.Fatalf("next day lost: %+v", got)
	}

	// A flush the store did not send keeps the denials and the holds for the
	// next one, and what came in meanwhile adds to them.
	bad, _ := NewRecorder(Options{Prefix: "p_"}, failingSink{fmt.Errorf("%w: %w: down", store.ErrUnavailable, store.ErrNotSent)}, clock)
	bad.Denied(r0, now, true)
	bad.HoldsIn(r0, DayWindow(DayOf(now)), Holds{Count: 2, Held: 600, Expired: 300})
	if err := bad.Flush(ctx); err == nil {
		t.Fatal("want flush error")
	}
	bad.HoldsIn(r0, DayWindow(DayOf(now)), Holds{Count: 1, Held: 300})
	bad.sink = mem
	if err := bad.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got3, _ := mem.Read(ctx, r0, DayWindow(DayOf(now)))
	if got3.Denials.Shadow != 1 || got3.Holds != (Holds{Count: 3, Held: 900, Expired: 300}) {
		t.Fatalf("retried denial and holds: %+v", got3)
	}
	// Nothing pending: a second flush adds nothing.
	if err := bad.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if again, _ := mem.Read(ctx, r0, DayWindow(DayOf(now))); again.Holds != got3.Holds {
		t.Fatalf("holds counted twice: %+v", again.Holds)
	}

	// A flush sent and unanswered (applied, then its reply lost) is not sent
	// again: a second send would count it twice.
	lost, _ := NewRecorder(Options{Prefix: "p_"}, appliedThenFailed{mem}, clock)
	lost.Denied(r0, now, false)
	lost.Defer(lost.Usage(r0, "carol", now, 1000))
	err = lost.Flush(ctx)
	if err == nil || !strings.Contains(err.Error(), "1 denial and hold counts, 1000 deferred tokens") {
		t.Fatalf("flush answered %v, want what it gave up named", err)
	}
	lost.sink = mem
	if err := lost.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got4, _ := mem.Read(ctx, r0, DayWindow(DayOf(now)))
	if got4.Usage["carol"] != 1000 || got4.Denials.Enforce != 1 {
		t.Fatalf("after an unanswered flush and a good one: carol %d tokens, %d denials; want 1000 and 1 (sent once)", got4.Usage["carol"], got4.Denials.Enforce)
	}
}

// appliedThenFailed applies a batch and answers as a send whose reply was
// lost does.
type appliedThenFailed struct{ s Sink }

func (a appliedThenFailed) Apply(ctx context.Context, b Batch) error {
	if err := a.s.Apply(ctx, b); err != nil {
		return err
	}
	return fmt.Errorf("%w: %w", store.ErrUnavailable, context.DeadlineExceeded)
}

// TestRecorderHolds: reservation totals go to their window's stats hash under
// their own fields, never to a principal's, and a window with holds only (a
// check whose charge never came) is listed and read.
func TestRecorderHolds(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 10, 17, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	mem := NewMemory("", clock)
	rec, err := NewRecorder(Options{MaxPendingPrincipals: 1}, mem, clock)
	if err != nil {
		t.Fatal(err)
	}
	r0, r1 := RuleID{"budget", "set/b"}, RuleID{"budget", "set/b#cost"}
	day, hour := DayWindow(DayOf(now)), WindowAt(PeriodHour, now, nil)
	for range 1000 { // far past the per-principal bound: totals are not bounded by it
		rec.HoldsIn(r0, day, Holds{Count: 1, Held: 50_000})
	}
	rec.HoldsIn(r0, day, Holds{Expired: 50_000})
	rec.HoldsIn(r0, day, Holds{}) // nothing: no entry
	rec.HoldsIn(r1, hour, Holds{Count: 1, Held: 7})
	rec.DeniedIn(r0, day, Denial{Principal: "run-1", Shadow: true, Reserve: true})
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	d, _ := mem.Read(ctx, r0, day)
	if d.Holds != (Holds{Count: 1000, Held: 50_000_000, Expired: 50_000}) || d.Denials != (Denials{Shadow: 1, Reserve: 1}) || d.PrincipalDenials["run-1"] != (Denials{Shadow: 1, Reserve: 1}) || len(d.PrincipalDenials) != 1 {
		t.Fatalf("day: %+v", d)
	}
	var fields map[string]uint64
	mem.ExportHashes(func(key string, _ time.Time, fs map[string]uint64) {
		if key == WindowStatsKey("", r0, day) {
			fields = maps.Clone(fs)
		}
	})
	want := map[string]uint64{"holds": 1000, "held": 50_000_000, "expired": 50_000, "shadow": 1, "reserve": 1, "s:run-1": 1, "r:run-1": 1}
	if !maps.Equal(fields, want) {
		t.Fatalf("stats hash fields %v, want %v", fields, want)
	}
	keys, _ := mem.Keys(ctx, []Window{hour})
	if len(keys) != 1 || keys[0] != (Key{r1, hour}) {
		t.Fatalf("a window with holds only: keys %v", keys)
	}
	all, err := ReadAll(ctx, mem, []Window{hour})
	if err != nil || len(all) != 1 || all[0].Holds != (Holds{Count: 1, Held: 7}) || len(all[0].Usage) != 0 {
		t.Fatalf("a window with holds only: %+v %v", all, err)
	}
}

func TestMemoryBound(t *testing.T) {
	now := time.Date(2026, 10, 17, 12, 0, 0, 0, time.UTC)
	m := NewMemory("", func() time.Time { return now })
	m.MaxFields = 2
	if !m.HIncrBy("k", "a", 1) || !m.HIncrBy("k", "b", 1) || !m.HIncrBy("k", "a", 5) {
		t.Fatal("writes under the bound refused")
	}
	if m.HIncrBy("k2", "c", 1) || m.Dropped() != 1 {
		t.Fatal("write past the bound accepted")
	}
	// Expired hashes free their fields.
	_ = m.Apply(context.Background(), Batch{Expire: map[string]time.Time{"k": now.Add(time.Second)}})
	now = now.Add(2 * time.Second)
	if !m.HIncrBy("k2", "c", 1) {
		t.Fatal("bound not released by expiry")
	}
}

func TestFromDescriptor(t *testing.T) {
	e := func(kv ...string) []*rlcommon.RateLimitDescriptor_Entry {
		var out []*rlcommon.RateLimitDescriptor_Entry
		for i := 0; i < len(kv); i += 2 {
			out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	rule := "ns/p/rule/0"
	// Envoy Gateway: generic_key named by the config, then a Distinct header, then an exclusion.
	r, p := FromDescriptor("ns/p", "cfg", e(rule, rule, "rule-0-match-0", "alice", "rule-0-match-1", "rule-0-match-1"), 0b010)
	if r != (RuleID{"ns/p", rule}) || p != "alice" {
		t.Fatalf("%v %q", r, p)
	}
	// A Distinct value equal to its key is still that principal, not a shared bucket.
	_, p = FromDescriptor("ns/p", "cfg", e(rule, rule, "rule-0-match-0", "rule-0-match-0"), 0b010)
	if p != "rule-0-match-0" {
		t.Fatalf("%q", p)
	}
	// Group bucket: nothing free.
	_, p = FromDescriptor("ns/p", "cfg", e(rule, rule, "rule-1-match-0", "rule-1-match-0"), 0)
	if p != "" {
		t.Fatalf("%q", p)
	}
	// A plain config keyed on a bare first entry: the rule is the config path.
	r, p = FromDescriptor("d", "d.user", e("user", "bob"), 1)
	if r != (RuleID{"d", "d.user"}) || p != "bob" {
		t.Fatalf("%v %q", r, p)
	}
}

// TestLongValuePrincipal: a value too long for a counter key is recorded
// under its digest, the same field every time (across restarts and
// replicas: no seed), shown as "sha256:<hex>", and never the field of a
// short value that spells that digest, alone or beside other values: two
// principals are never merged in the ledger or the report.
func TestLongValuePrincipal(t *testing.T) {
	long := strings.Repeat("x", rlkey.MaxValueBytes+1)
	e := func(vs ...string) []*rlcommon.RateLimitDescriptor_Entry {
		var out []*rlcommon.RateLimitDescriptor_Entry
		for _, v := range vs {
			out = append(out, &rlcommon.RateLimitDescriptor_Entry{Key: "user", Value: v})
		}
		return out
	}
	_, lp := FromDescriptor("d", "d.user", e(long), 1)
	_, again := FromDescriptor("d", "d.user", e(strings.Clone(long)), 1)
	_, sp := FromDescriptor("d", "d.user", e(rlkey.Digest(long)), 1)
	if lp != again || lp == sp || len(lp) > 100 {
		t.Fatalf("long %q (again %q), short spelling its digest %q: want one bounded field for the long value, another for the short", lp, again, sp)
	}
	if got := PrincipalName(lp); got != rlkey.Digest(long) {
		t.Errorf("name of the long value: %q, want %q", got, rlkey.Digest(long))
	}
	_, lp2 := FromDescriptor("d", "d.user", e(long, "a"), 0b11)
	_, sp2 := FromDescriptor("d", "d.user", e(rlkey.Digest(long), "a"), 0b11)
	if lp2 == sp2 || PrincipalName(lp2) != rlkey.Digest(long)+", a" {
		t.Errorf("two values: long %q, short %q (name %q)", lp2, sp2, PrincipalName(lp2))
	}
	for _, f := range []string{`\#sha256:` + strings.Repeat("A", 64), `\#sha256:` + strings.Repeat("a", 63), `a\#sha256:` + strings.Repeat("a", 64), `\#sha256:` + strings.Repeat("a", 64) + "b"} {
		if p, err := DecodePrincipal(f); err == nil {
			t.Errorf("DecodePrincipal(%q) = %q, want an error (a digest is a whole part of 64 lowercase hex digits)", f, p)
		}
	}
}

// BenchmarkRecorderUsage is the ledger's CPU cost on the charge path: naming
// the rule and principal of a descriptor and building the usage write.
func BenchmarkRecorderUsage(b *testing.B) {
	rec, _ := NewRecorder(Options{}, NewMemory("", nil), nil)
	rule := "ai-gateway/ai-budgets-agent-router/rule/0"
	entries := []*rlcommon.RateLimitDescriptor_Entry{
		{Key: rule, Value: rule},
		{Key: "rule-0-match-0", Value: "run-00000042-0000-4000-8000-000000000042"},
	}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		r, p := FromDescriptor("ai-gateway/ai-budgets-agent-router", "cfg", entries, 0b10)
		u := rec.Usage(r, p, now, 1234)
		if u.Key == "" {
			b.Fatal("no key")
		}
	}
}

func TestEncodePrincipal1(t *testing.T) {
	for _, v := range []string{"", "a", `a\b`, "a,b", `\e`} {
		if EncodePrincipal1(v) != EncodePrincipal([]string{v}) {
			t.Errorf("%q: %q != %q", v, EncodePrincipal1(v), EncodePrincipal([]string{v}))
		}
	}
}

// TestDayInFollowsTheZone: under RESET_TIME_ZONE the ledger's day is the
// local date, the day window that holds the charge.
func TestDayInFollowsTheZone(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC) // 22:00 on Dec 1 in New York
	if got := DayIn(at, ny).String(); got != "2026-12-01" {
		t.Fatalf("DayIn New York = %s, want 2026-12-01", got)
	}
	if got := DayIn(at, nil); got != DayOf(at) || got.String() != "2026-12-02" {
		t.Fatalf("DayIn UTC = %s, want 2026-12-02", got)
	}
	r, err := NewRecorder(Options{Location: ny}, NewMemory("", nil), func() time.Time { return at })
	if err != nil {
		t.Fatal(err)
	}
	if u := r.Usage(RuleID{"d", "r"}, "p", at, 1); u.Key != UsageKey("", RuleID{"d", "r"}, DayIn(at, ny)) || !strings.Contains(u.Key, ":20261201:") {
		t.Fatalf("usage key %q is not New York's Dec 1", u.Key)
	}
}
