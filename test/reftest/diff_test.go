package reftest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/engine"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
	"github.com/budgetgen/budgetgen/internal/store/valkey"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
	"github.com/budgetgen/budgetgen/test/reftest"
)

// diffConfig exercises every matching and limit feature the sequence uses.
const diffConfig = `domain: diff
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: tokens
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: tier
    value: gold
    rate_limit: {unlimited: true, replaces: [{name: per_user}]}
  - key: who
    rate_limit: {unit: hour, requests_per_unit: 2, name: per_user}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: kill
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: quota
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: generic_key
    value: default/policy/rule/0
    descriptors:
      - key: rule-0-match-0
        rate_limit: {unit: day, requests_per_unit: 4}
  - key: week
    rate_limit: {unit: week, requests_per_unit: 2}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 2}
  - key: year
    rate_limit: {unit: year, requests_per_unit: 2}
  - key: files
    value: f*
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: nested
    value: n*
    descriptors:
      - key: leaf
        rate_limit: {unit: minute, requests_per_unit: 1}
`

type step struct {
	name string
	req  *rlpb.RateLimitRequest
}

func dsc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func hits(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func rq(domain string, h uint32, ds ...*rlcommon.RateLimitDescriptor) *rlpb.RateLimitRequest {
	return &rlpb.RateLimitRequest{Domain: domain, HitsAddend: h, Descriptors: ds}
}

func sequence() []step {
	var s []step
	add := func(name string, r *rlpb.RateLimitRequest) { s = append(s, step{name, r}) }
	for i := 0; i < 7; i++ {
		add(fmt.Sprintf("plain hit %d crossing 5/day", i), rq("diff", 0, dsc("user", "alice")))
	}
	add("request hits_addend 3", rq("diff", 3, dsc("user", "bob")))
	add("request hits_addend 3 crossing", rq("diff", 3, dsc("user", "bob")))
	add("request hits_addend 0 means 1", rq("diff", 0, dsc("user", "carol")))
	add("descriptor check-only fresh", rq("diff", 0, hits(dsc("tokens", "t1"), 0)))
	add("descriptor 60 tokens", rq("diff", 9, hits(dsc("tokens", "t1"), 60)))
	add("descriptor check-only", rq("diff", 0, hits(dsc("tokens", "t1"), 0)))
	add("descriptor 40 tokens to exactly the limit", rq("diff", 0, hits(dsc("tokens", "t1"), 40)))
	add("check-only at the limit is OK", rq("diff", 0, hits(dsc("tokens", "t1"), 0)))
	add("one more token is over", rq("diff", 0, hits(dsc("tokens", "t1"), 1)))
	add("check-only above the limit is over", rq("diff", 0, hits(dsc("tokens", "t1"), 0)))
	add("mixed request and descriptor addends", rq("diff", 2, dsc("user", "dave"), hits(dsc("tokens", "t2"), 7), hits(dsc("tokens", "t3"), 0)))
	for i := 0; i < 4; i++ {
		add(fmt.Sprintf("shadow %d", i), rq("diff", 0, dsc("shadow", "s")))
	}
	add("unlimited", rq("diff", 0, dsc("free", "x")))
	for i := 0; i < 3; i++ {
		add(fmt.Sprintf("replaced by gold %d", i), rq("diff", 0, dsc("who", "w"), dsc("tier", "gold")))
	}
	for i := 0; i < 3; i++ {
		add(fmt.Sprintf("not replaced %d", i), rq("diff", 0, dsc("who", "w"), dsc("tier", "silver")))
	}
	for i := 0; i < 4; i++ {
		add(fmt.Sprintf("wildcard %d", i), rq("diff", 0, dsc("path", "/api/v1/items")))
	}
	add("wildcard miss", rq("diff", 0, dsc("path", "/web")))
	add("unknown domain", rq("nope", 0, dsc("user", "alice")))
	add("unmatched key", rq("diff", 0, dsc("other", "x")))
	add("depth mismatch", rq("diff", 0, dsc("user", "alice", "extra", "x")))
	add("limit 0 check-only", rq("diff", 0, hits(dsc("kill", "k"), 0)))
	add("limit 0 denies", rq("diff", 0, dsc("kill", "k")))
	add("quota mode 1", rq("diff", 0, dsc("quota", "q")))
	add("quota mode 2", rq("diff", 0, dsc("quota", "q")))
	for i := 0; i < 5; i++ {
		add(fmt.Sprintf("nested EG shape %d", i), rq("diff", 0, dsc("generic_key", "default/policy/rule/0", "rule-0-match-0", "eve")))
	}
	// values with '_' share a counter in the envoy format: both services must agree.
	add("underscore a", rq("diff", 0, dsc("user", "x_y")))
	add("underscore b", rq("diff", 0, dsc("user", "x_y")))
	for _, u := range []string{"week", "month", "year"} {
		for i := 0; i < 3; i++ {
			add(fmt.Sprintf("%s %d", u, i), rq("diff", 0, dsc(u, "p")))
		}
	}
	// share_threshold: every value under the wildcard shares one counter.
	for _, v := range []string{"foo", "fab", "fx"} {
		add("share_threshold "+v, rq("diff", 0, dsc("files", v)))
	}
	for _, v := range []string{"n1", "n2", "n1"} {
		add("wildcard parent "+v, rq("diff", 0, dsc("nested", v, "leaf", "x")))
	}
	over := dsc("any", "thing")
	over.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
	for i := 0; i < 3; i++ {
		add(fmt.Sprintf("request limit override %d", i), rq("diff", 0, over))
	}
	add("many descriptors in one request", rq("diff", 0, dsc("user", "m1"), dsc("user", "m2"), dsc("shadow", "m3"), dsc("free", "m4"), dsc("path", "/api/z"), dsc("nope", "z")))
	return s
}

func writeRuntime(t *testing.T) string {
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "diff.yaml"), []byte(diffConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

type ours struct {
	eng    *engine.Engine
	client rlpb.RateLimitServiceClient
}

func startOurs(t *testing.T, addr string, keys key.Encoder, shadow ...bool) *ours {
	st, err := valkey.New(valkey.Options{Addresses: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	// Epoch windows: the reference's (its keys, resets and expiries); the
	// calendar default differs on purpose for weeks, months and years.
	windows, err := window.New(window.Options{Mode: window.Epoch})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Options{Store: st, Keys: keys, Windows: windows, StoreTimeout: time.Second, ShadowMode: len(shadow) > 0 && shadow[0]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	c, err := config.Load([]config.File{{Name: "diff.yaml", Data: []byte(diffConfig)}})
	if err != nil {
		t.Fatal(err)
	}
	eng.SetConfig(c)
	srv, err := server.New(eng, server.Options{GRPCAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, time.Second); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	g, _, _, _ := srv.Addrs()
	return &ours{eng: eng, client: dial(t, g.String())}
}

func dial(t *testing.T, addr string) rlpb.RateLimitServiceClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlpb.NewRateLimitServiceClient(conn)
}

func startReference(t *testing.T, redis string, env ...string) rlpb.RateLimitServiceClient {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := reftest.Binary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := reftest.Start(ctx, reftest.Options{Binary: bin, RedisAddr: redis, RuntimeRoot: writeRuntime(t),
		LogPath: filepath.Join(t.TempDir(), "ref.log"), Env: append([]string{"CACHE_KEY_PREFIX=rl_"}, env...)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return dial(t, p.GRPCAddr)
}

// avoidMinuteBoundary waits so the sequence runs inside one minute window.
func avoidMinuteBoundary() {
	if s := time.Now().Unix() % 60; s > 45 {
		time.Sleep(time.Duration(61-s) * time.Second)
	}
}

func describe(r *rlpb.RateLimitResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "overall=%s", r.OverallCode)
	for i, s := range r.Statuses {
		fmt.Fprintf(&b, " [%d %s rem=%d limit=%d/%s]", i, s.Code, s.LimitRemaining, s.CurrentLimit.GetRequestsPerUnit(), s.CurrentLimit.GetUnit())
	}
	return b.String()
}

// TestDifferentialAgainstReference runs the same request sequence against
// envoyproxy/ratelimit and against this service in the envoy key format,
// each on its own Valkey, and requires identical codes, remaining counts,
// current limits and reset durations (within the second the calls straddle);
// then identical counter keys and values in both Valkeys (proving the envoy
// format is byte-identical); then the same answers again in the safe format.
func TestDifferentialAgainstReference(t *testing.T) {
	refValkey := valkeytest.Start(t, valkeytest.Options{})
	ourValkey := valkeytest.Start(t, valkeytest.Options{})
	safeValkey := valkeytest.Start(t, valkeytest.Options{})
	ref := startReference(t, refValkey.Addr)
	envoyFmt := startOurs(t, ourValkey.Addr, key.Encoder{Prefix: "rl_", Format: key.Envoy})
	safeFmt := startOurs(t, safeValkey.Addr, key.Encoder{Prefix: "rl_"})
	avoidMinuteBoundary()
	ctx := context.Background()
	for _, st := range sequence() {
		want, err := ref.ShouldRateLimit(ctx, st.req)
		if err != nil {
			t.Fatalf("%s: reference: %v", st.name, err)
		}
		for name, o := range map[string]*ours{"envoy": envoyFmt, "safe": safeFmt} {
			got, err := o.client.ShouldRateLimit(ctx, st.req)
			if err != nil {
				t.Fatalf("%s (%s keys): ours: %v", st.name, name, err)
			}
			if describe(got) != describe(want) {
				t.Fatalf("%s (%s keys):\n ours      %s\n reference %s", st.name, name, describe(got), describe(want))
			}
			for i := range want.Statuses {
				w, g := want.Statuses[i].DurationUntilReset, got.Statuses[i].DurationUntilReset
				if (w == nil) != (g == nil) || w.GetSeconds()-g.GetSeconds() > 1 || g.GetSeconds()-w.GetSeconds() > 1 {
					t.Fatalf("%s (%s keys): status %d duration_until_reset ours %v reference %v", st.name, name, i, g, w)
				}
			}
		}
	}
	envoyFmt.eng.Flush()
	refKeys, ourKeys := dump(t, refValkey.Addr), dump(t, ourValkey.Addr)
	// The reference answers a check-only descriptor with INCRBY 0, which
	// creates a counter at 0; we answer it with a read. Counters above 0 must
	// be identical, key for key.
	for k, v := range refKeys {
		if v == "0" {
			delete(refKeys, k)
		}
	}
	if fmt.Sprint(sorted(refKeys)) != fmt.Sprint(sorted(ourKeys)) {
		t.Fatalf("counters differ:\n ours      %v\n reference %v", sorted(ourKeys), sorted(refKeys))
	}
	if len(ourKeys) < 15 {
		t.Fatalf("only %d counters compared", len(ourKeys))
	}
	for k := range ourKeys {
		ttl, err := valkeytest.Do(ourValkey.Addr, "PTTL", k)
		if err != nil || ttl == "-1" || strings.HasPrefix(ttl, "-") {
			t.Fatalf("our counter %s has no expiry: %s %v", k, ttl, err)
		}
	}
	t.Logf("%d counters identical, e.g. %s", len(ourKeys), sorted(ourKeys)[0])
}

// TestDifferentialGlobalShadowMode: with SHADOW_MODE=true both services keep
// descriptor statuses OVER_LIMIT but answer an overall OK.
func TestDifferentialGlobalShadowMode(t *testing.T) {
	refValkey := valkeytest.Start(t, valkeytest.Options{})
	ourValkey := valkeytest.Start(t, valkeytest.Options{})
	ref := startReference(t, refValkey.Addr, "SHADOW_MODE=true")
	o := startOurs(t, ourValkey.Addr, key.Encoder{Prefix: "rl_", Format: key.Envoy}, true)
	avoidMinuteBoundary()
	ctx := context.Background()
	sawOver := false
	for i := 0; i < 4; i++ {
		for _, r := range []*rlpb.RateLimitRequest{rq("diff", 0, dsc("kill", "k")), rq("diff", 0, dsc("who", "w"), dsc("shadow", "s"))} {
			want, err := ref.ShouldRateLimit(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			got, err := o.client.ShouldRateLimit(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			if describe(got) != describe(want) {
				t.Fatalf("step %d:\n ours      %s\n reference %s", i, describe(got), describe(want))
			}
			sawOver = sawOver || strings.Contains(describe(want), "OVER_LIMIT")
		}
	}
	if !sawOver {
		t.Fatal("sequence never produced an OVER_LIMIT status")
	}
}

func dump(t *testing.T, addr string) map[string]string {
	out, err := valkeytest.Do(addr, "KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, k := range strings.Split(out, "\n") {
		if k == "" {
			continue
		}
		v, err := valkeytest.Do(addr, "GET", k)
		if err != nil {
			t.Fatal(err)
		}
		m[k] = v
	}
	return m
}

func sorted(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
