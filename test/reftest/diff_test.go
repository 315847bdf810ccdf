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
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/engine"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/refseq"
	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
	"github.com/budgetgen/budgetgen/internal/store/valkey"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
	"github.com/budgetgen/budgetgen/test/reftest"
)

// diffConfig is the sequence's config (internal/ratelimit/refseq).
const diffConfig = refseq.Config

func dsc(kv ...string) *rlcommon.RateLimitDescriptor { return refseq.Dsc(kv...) }

func rq(domain string, h uint32, ds ...*rlcommon.RateLimitDescriptor) *rlpb.RateLimitRequest {
	return refseq.Rq(domain, h, ds...)
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

func startOurs(t *testing.T, addr, transport string, keys key.Encoder, shadow ...bool) *ours {
	st, err := valkey.New(valkey.Options{Addresses: []string{addr}, KeyPrefix: keys.Prefix})
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
	srv, err := server.New(eng, server.Options{GRPCAddr: "127.0.0.1:0", Transport: transport})
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
		time.Sleep(time.Duration(61-s) * time.Second) // stays: the wall clock must pass the minute boundary
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
	grpcGoValkey := valkeytest.Start(t, valkeytest.Options{})
	ref := startReference(t, refValkey.Addr)
	envoyFmt := startOurs(t, ourValkey.Addr, server.TransportLean, key.Encoder{Prefix: "rl_", Format: key.Envoy})
	safeFmt := startOurs(t, safeValkey.Addr, server.TransportLean, key.Encoder{Prefix: "rl_"})
	// The same answers on the other transport (GRPC_SERVER_IMPL=grpc-go).
	grpcGo := startOurs(t, grpcGoValkey.Addr, server.TransportGRPCGo, key.Encoder{Prefix: "rl_", Format: key.Envoy})
	avoidMinuteBoundary()
	ctx := context.Background()
	for _, st := range refseq.Steps() {
		want, err := ref.ShouldRateLimit(ctx, st.Request)
		if err != nil {
			t.Fatalf("%s: reference: %v", st.Name, err)
		}
		// The table internal/ratelimit/decide is tested with must be the
		// reference's answers, not our reading of them.
		if got := refseq.Describe(want); got != st.Want {
			t.Fatalf("%s: the reference answers %s, internal/ratelimit/refseq says %s", st.Name, got, st.Want)
		}
		for name, o := range map[string]*ours{"envoy": envoyFmt, "safe": safeFmt, "envoy, grpc-go transport": grpcGo} {
			got, err := o.client.ShouldRateLimit(ctx, st.Request)
			if err != nil {
				t.Fatalf("%s (%s keys): ours: %v", st.Name, name, err)
			}
			if describe(got) != describe(want) {
				t.Fatalf("%s (%s keys):\n ours      %s\n reference %s", st.Name, name, describe(got), describe(want))
			}
			for i := range want.Statuses {
				w, g := want.Statuses[i].DurationUntilReset, got.Statuses[i].DurationUntilReset
				if (w == nil) != (g == nil) || w.GetSeconds()-g.GetSeconds() > 1 || g.GetSeconds()-w.GetSeconds() > 1 {
					t.Fatalf("%s (%s keys): status %d duration_until_reset ours %v reference %v", st.Name, name, i, g, w)
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
	o := startOurs(t, ourValkey.Addr, server.TransportLean, key.Encoder{Prefix: "rl_", Format: key.Envoy}, true)
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
		if k == "" || valkey.OwnKey("rl_", k) {
			continue // our store's call ids: bookkeeping, not counters
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
