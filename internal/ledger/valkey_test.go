package ledger

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

func newClient(t *testing.T, addrs ...string) valkey.Client {
	t.Helper()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestValkeyLedgerRoundTrip(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	exerciseValkey(t, newClient(t, srv.Addr), func(k string) string {
		out, err := srv.Do("PEXPIRETIME", k)
		if err != nil {
			t.Fatal(err)
		}
		return out
	})
}

// exerciseValkey writes through a Recorder and the usage command and reads it
// back, checking values and absolute expiries.
func exerciseValkey(t *testing.T, c valkey.Client, pexpiretime func(string) string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Valkey expires keys on its own real clock, so the injected time must be
	// in the future of it: tomorrow noon UTC.
	now := (DayOf(time.Now()) + 1).Start().Add(12 * time.Hour)
	clock := func() time.Time { return now }
	v := NewValkey(c, "rl:")
	// The service flushes through the counter store's client: the sink.
	rec, err := NewRecorder(Options{Prefix: "rl:", RetentionDays: 8}, NewValkeySink(c), clock)
	if err != nil {
		t.Fatal(err)
	}
	rules := []RuleID{{"ns/p", "ns/p/rule/0"}, {"ns/p", "ns/p/rule/1"}, {"ns/q", "ns/q/rule/0"}, {"a|b", "c"}, {"a", "b|c"}}
	var us []Usage
	want := map[RuleID]map[string]uint64{}
	for i, r := range rules {
		want[r] = map[string]uint64{}
		for j := 0; j < 20; j++ {
			p := EncodePrincipal([]string{fmt.Sprintf("user-%d", j)})
			n := uint64((i + 1) * (j + 1) * 1000)
			us = append(us, rec.Usage(r, p, now, n))
			want[r][p] += n
		}
	}
	if err := v.Add(ctx, us...); err != nil {
		t.Fatal(err)
	}
	rec.Defer(rec.Usage(rules[1], "user-0", now, 5))
	want[rules[1]]["user-0"] += 5
	rec.Denied(rules[0], now, true)
	rec.Denied(rules[0], now, false)
	rec.Denied(rules[0], now, false)
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	d := DayOf(now)
	got, err := v.Keys(ctx, []Window{DayWindow(d)})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(rules) {
		all, _ := c.Do(ctx, c.B().Keys().Pattern("*").Build()).AsStrSlice()
		t.Fatalf("rules %v; keys %q", got, all)
	}
	if other, _ := v.Keys(ctx, []Window{DayWindow(d - 1)}); len(other) != 0 {
		t.Fatalf("rules on a day without data: %v", other)
	}
	for _, r := range rules {
		dd, err := v.Read(ctx, r, DayWindow(d))
		if err != nil {
			t.Fatal(err)
		}
		if len(dd.Usage) != 20 {
			t.Fatalf("%v: %d principals", r, len(dd.Usage))
		}
		for p, n := range want[r] {
			if dd.Usage[p] != n {
				t.Fatalf("%v %s: %d, want %d", r, p, dd.Usage[p], n)
			}
		}
		wantExp := strconv.FormatInt((d + 9).Start().UnixMilli(), 10)
		if e := pexpiretime(UsageKey("rl:", r, d)); e != wantExp {
			t.Fatalf("expiry of %v: %s, want %s (day end + 8 days)", r, e, wantExp)
		}
	}
	dd, _ := v.Read(ctx, rules[0], DayWindow(d))
	if dd.Denials != (Denials{Shadow: 1, Enforce: 2}) {
		t.Fatalf("denials %+v", dd)
	}
	all, err := ReadAll(ctx, v, []Window{DayWindow(d - 1), DayWindow(d)})
	if err != nil || len(all) != len(rules) {
		t.Fatalf("ReadAll: %d %v", len(all), err)
	}
	exerciseWeek(t, ctx, v, rec, now, rules[2], pexpiretime, len(rules))
}

// exerciseWeek: a week window with a principal's reservation denial, its
// absolute expiry, and ReadAll of every window (the day ones too).
func exerciseWeek(t *testing.T, ctx context.Context, v *Valkey, rec *Recorder, now time.Time, rule RuleID, pexpiretime func(string) string, dayRules int) {
	ww := WindowAt(PeriodWeek, now, nil)
	if err := v.Add(ctx, rec.UsageIn(rule, "user-1", ww, 77)); err != nil {
		t.Fatal(err)
	}
	rec.DeniedIn(rule, ww, Denial{Principal: "user-1", Reserve: true})
	rec.HoldsIn(rule, ww, Holds{Count: 3, Held: 150_000})
	rec.HoldsIn(rule, ww, Holds{Expired: 50_000})
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Two flushes add up (HINCRBY), they do not overwrite.
	rec.HoldsIn(rule, ww, Holds{Count: 1, Held: 50_000})
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	wd, err := v.Read(ctx, rule, ww)
	if err != nil || wd.Usage["user-1"] != 77 || wd.Denials != (Denials{Enforce: 1, Reserve: 1}) || wd.PrincipalDenials["user-1"] != (Denials{Enforce: 1, Reserve: 1}) {
		t.Fatalf("week window: %+v %v", wd, err)
	}
	if wd.Holds != (Holds{Count: 4, Held: 200_000, Expired: 50_000}) {
		t.Fatalf("week window holds %+v", wd.Holds)
	}
	if _, ok := wd.PrincipalDenials["holds"]; ok {
		t.Fatalf("a reservation total read as a principal: %+v", wd.PrincipalDenials)
	}
	wantExp := strconv.FormatInt(ww.End(nil).AddDate(0, 0, 8).UnixMilli(), 10)
	if e := pexpiretime(WindowStatsKey("rl:", rule, ww)); e != wantExp {
		t.Fatalf("week stats expiry %s, want %s (week end + 8 days)", e, wantExp)
	}
	if everything, err := ReadAll(ctx, v, nil); err != nil || len(everything) != dayRules+1 {
		t.Fatalf("ReadAll of every window: %d %v", len(everything), err)
	}
}

func TestValkeyLedgerCluster(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("cluster test skipped in -short")
	}
	addrs := valkeytest.StartCluster(t, 3).Addrs
	c := newClient(t, addrs...)
	exerciseValkey(t, c, func(k string) string {
		out, err := c.Do(context.Background(), c.B().Arbitrary("PEXPIRETIME").Keys(k).Build()).ToInt64()
		if err != nil {
			t.Fatal(err)
		}
		return strconv.FormatInt(out, 10)
	})
	// The rules' keys are spread over the nodes, and Rules found them all: check
	// that more than one node holds ledger keys, so the scan really crossed nodes.
	holding := 0
	for _, a := range addrs {
		if out, _ := valkeytest.Do(a, "DBSIZE"); out != "0" {
			holding++
		}
	}
	if holding < 2 {
		t.Fatalf("only %d node(s) hold ledger keys; the cross-node scan is not exercised", holding)
	}
}

// TestValkeyMemoryPerPrincipalDay measures the Valkey memory of one
// principal-day in the ledger with MEMORY USAGE and checks it stays within the
// documented bound (docs/measurement.md).
func TestValkeyMemoryPerPrincipalDay(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	c := newClient(t, srv.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v := NewValkey(c, "")
	now := time.Now()
	rec, _ := NewRecorder(Options{}, v, func() time.Time { return now })
	for _, tc := range []struct {
		n        int
		maxBytes float64
	}{
		{100, 60},     // listpack encoding (<= 128 fields)
		{10_000, 120}, // hashtable encoding
	} {
		r := RuleID{"ai-gateway/ai-budgets-agent-router", fmt.Sprintf("ai-gateway/ai-budgets-agent-router/rule/%d", tc.n)}
		var us []Usage
		for i := 0; i < tc.n; i++ {
			// A 36-character run id, typical of UUID principals.
			p := fmt.Sprintf("run-%08d-0000-4000-8000-%012d", i, i)
			us = append(us, rec.Usage(r, p, now, uint64(1_000_000+i*37)))
			if len(us) == 1000 {
				if err := v.Add(ctx, us...); err != nil {
					t.Fatal(err)
				}
				us = us[:0]
			}
		}
		if err := v.Add(ctx, us...); err != nil {
			t.Fatal(err)
		}
		out, err := srv.Do("MEMORY", "USAGE", UsageKey("", r, DayOf(now)), "SAMPLES", "0")
		if err != nil {
			t.Fatal(err)
		}
		total, _ := strconv.ParseFloat(out, 64)
		per := total / float64(tc.n)
		t.Logf("%d principals (36-char ids): %.0f bytes, %.1f bytes per principal-day", tc.n, total, per)
		if per > tc.maxBytes || per < 36 {
			t.Errorf("%d principals: %.1f bytes per principal-day, documented bound %.0f", tc.n, per, tc.maxBytes)
		}
	}
}

// repeatingClient answers the second HSCAN of key with the first page again
// (and its cursor), as HSCAN may: "A given element may be returned multiple
// times" (https://valkey.io/commands/scan/, Scan guarantees).
type repeatingClient struct {
	valkey.Client
	key   string
	calls int
}

func (c *repeatingClient) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	if args := cmd.Commands(); len(args) > 2 && args[0] == "HSCAN" && args[1] == c.key {
		if c.calls++; c.calls == 2 {
			cmd = c.Client.B().Hscan().Key(c.key).Cursor(0).Count(DefaultScanCount).Build()
		}
	}
	return c.Client.Do(ctx, cmd)
}

// A field HSCAN returns twice is counted once: denial and reservation
// totals come from the stats hash, where each field is a count.
func TestValkeyReadCountsARepeatedStatsFieldOnce(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	c := newClient(t, srv.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := RuleID{"ns/p", "ns/p/rule/0"}
	w := DayWindow(DayOf(time.Now()))
	sk := WindowStatsKey("", r, w)
	// Enough principals that the hash is a hashtable and HSCAN takes pages.
	const n = 3 * DefaultScanCount
	cmds := valkey.Commands{c.B().Hincrby().Key(sk).Field(FieldShadowDenials).Increment(n).Build(),
		c.B().Hincrby().Key(sk).Field(FieldHolds).Increment(7).Build()}
	for i := 0; i < n; i++ {
		cmds = append(cmds, c.B().Hincrby().Key(sk).Field(fmt.Sprintf("s:user-%d", i)).Increment(1).Build())
	}
	for _, res := range c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			t.Fatal(err)
		}
	}
	rc := &repeatingClient{Client: c, key: sk}
	d, err := NewValkey(rc, "").Read(ctx, r, w)
	if err != nil {
		t.Fatal(err)
	}
	if rc.calls < 3 {
		t.Fatalf("HSCAN of the stats hash took %d calls: no page was repeated", rc.calls)
	}
	if d.Denials != (Denials{Shadow: n}) || d.Holds != (Holds{Count: 7}) {
		t.Errorf("totals %+v %+v, want %d shadow denials and 7 holds", d.Denials, d.Holds, n)
	}
	if len(d.PrincipalDenials) != n {
		t.Fatalf("%d principals denied, want %d", len(d.PrincipalDenials), n)
	}
	for p, pd := range d.PrincipalDenials {
		if pd != (Denials{Shadow: 1}) {
			t.Fatalf("%s: %+v, want 1 shadow denial", p, pd)
		}
	}
}

// A prefix with glob characters (CACHE_KEY_PREFIX is free text) lists its
// own keys, and only those.
func TestValkeyKeysWithAGlobPrefix(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	c := newClient(t, srv.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := RuleID{"ns/p", "ns/p/rule/0"}
	w := DayWindow(DayOf(time.Now()))
	for _, prefix := range []string{`rl[eu]:`, `rl*:`, `rl?\:`} {
		if err := NewValkey(c, prefix).Add(ctx, Usage{Key: WindowUsageKey(prefix, r, w), Field: "alice", Tokens: 5}); err != nil {
			t.Fatal(err)
		}
	}
	if err := NewValkey(c, "rle:").Add(ctx, Usage{Key: WindowUsageKey("rle:", r, w), Field: "bob", Tokens: 7}); err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{`rl[eu]:`, `rl*:`, `rl?\:`} {
		keys, err := NewValkey(c, prefix).Keys(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 1 || keys[0] != (Key{r, w}) {
			t.Fatalf("prefix %q: keys %v, want its one rule-window", prefix, keys)
		}
	}
}
