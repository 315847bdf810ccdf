package reliability

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// awayFromMidnight waits (at most 20 s) if the UTC day ends within the next
// 20 s, so a test that spans two service lifetimes stays in one daily window.
func awayFromMidnight() {
	now := time.Now().UTC()
	next := now.Truncate(24 * time.Hour).Add(24 * time.Hour)
	if until := next.Sub(now); until < 20*time.Second {
		time.Sleep(until + 100*time.Millisecond) // stays: the wall clock must pass midnight
	}
}

func call(t *testing.T, s *svc, r *rlpb.RateLimitRequest) *rlpb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientDeadline)
	defer cancel()
	resp, err := s.client(0).ShouldRateLimit(ctx, r)
	if err != nil {
		t.Fatalf("ShouldRateLimit %v: %v", r, err)
	}
	return resp
}

// TestServiceRestartMidDay stops the service in the middle of a day and
// starts a new one on the same Valkey and config directory, whose config
// was changed while the service was down: budgets continue where they
// were (no reset), over-limit hits deferred by the local cache were charged
// at shutdown, and the new service runs the changed config.
func TestServiceRestartMidDay(t *testing.T) {
	awayFromMidnight()
	vk := valkeytest.Start(t, valkeytest.Options{})
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", `domain: rl
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: team
    rate_limit: {unit: day, requests_per_unit: 3}
`)
	env := merge(valkeyEnv(vk.Addr), map[string]string{"CACHE_KEY_PREFIX": "mid:"})
	a := startSvc(t, svcOptions{ConfigDir: dir, Env: env})
	var sent uint64
	// alice: 3 calls, one of them with hits_addend 2 -> 4 of 5 used.
	for i, hits := range []uint32{1, 2, 1} {
		r := req("rl", "user", "alice")
		r.HitsAddend = hits
		resp := call(t, a, r)
		sent += uint64(hits)
		if want := uint32(5 - (sent)); resp.OverallCode != rlpb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != want {
			t.Fatalf("alice call %d: %v, want OK with %d remaining", i, resp, want)
		}
	}
	// bob: 8 calls of 1 -> over limit from the 6th; from the 7th the local
	// over-limit cache answers and defers the charge.
	for i := 1; i <= 8; i++ {
		resp := call(t, a, req("rl", "user", "bob"))
		sent++
		if over := i > 5; over != (resp.OverallCode == rlpb.RateLimitResponse_OVER_LIMIT) {
			t.Fatalf("bob call %d: %v", i, resp)
		}
	}
	if hits := metric(a.metrics(), "ratelimit_over_limit_cache_total{result=\"hit\"}"); hits < 1 {
		t.Logf("metrics:\n%s", a.metrics())
		t.Fatalf("the over-limit cache answered no call (hits %v); the deferred-charge path is not exercised", hits)
	}
	// A descriptor-level check (hits_addend 0) charges nothing.
	chk := req("rl", "team", "red")
	chk.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	if resp := call(t, a, chk); resp.OverallCode != rlpb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 3 {
		t.Fatalf("team check: %v", resp)
	}
	if err := a.stop(); err != nil {
		t.Fatalf("stop service A: %v", err)
	}
	// Every hit is in Valkey once service A is gone: 4 for alice, 8 for bob
	// (the deferred over-limit hits were charged at shutdown).
	if total, keys := sumKeys(t, vk.Addr, "mid:"); total != sent || keys != 2 {
		t.Fatalf("after service A stopped: Valkey holds %d hits in %d keys, want %d in 2", total, keys, sent)
	}

	// The config changes while no service runs: team's limit 3 -> 10.
	writeFile(t, dir, "rl.yaml", `domain: rl
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: team
    rate_limit: {unit: day, requests_per_unit: 10}
`)
	b := startSvc(t, svcOptions{ConfigDir: dir, Env: env})
	if resp := call(t, b, req("rl", "user", "alice")); resp.OverallCode != rlpb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("alice after restart: %v, want OK with 0 remaining (5th of 5)", resp)
	}
	if resp := call(t, b, req("rl", "user", "alice")); resp.OverallCode != rlpb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("alice's 6th hit after restart: %v, want OVER_LIMIT", resp)
	}
	if resp := call(t, b, req("rl", "user", "bob")); resp.OverallCode != rlpb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("bob after restart: %v, want OVER_LIMIT (his budget was spent before the restart)", resp)
	}
	if resp := call(t, b, req("rl", "team", "red")); resp.OverallCode != rlpb.RateLimitResponse_OK ||
		resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 10 || resp.Statuses[0].LimitRemaining != 9 {
		t.Fatalf("team after restart: %v, want the reloaded limit 10 with 9 remaining", resp)
	}
	sent += 4
	if err := b.stop(); err != nil {
		t.Fatalf("stop service B: %v", err)
	}
	if total, _ := sumKeys(t, vk.Addr, "mid:"); total != sent {
		t.Fatalf("Valkey holds %d hits, want exactly the %d sent", total, sent)
	}
}

// TestServiceValkeyRestartAOF: Valkey with AOF (appendfsync everysec) is shut
// down and started again under load; the running service reconnects by
// itself within 1 s of Valkey answering, the counters survive (each
// worker's counter is never below what Valkey acknowledged to it) with
// their absolute expiry, and every hit sent ends in Valkey except the
// ambiguous ones in flight at the shutdown.
func TestServiceValkeyRestartAOF(t *testing.T) {
	awayFromMidnight()
	vk := valkeytest.Start(t, valkeytest.Options{Args: []string{"--appendonly", "yes", "--appendfsync", "everysec"}})
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", budgetsYAML)
	s := startSvc(t, svcOptions{ConfigDir: dir, Env: merge(valkeyEnv(vk.Addr), map[string]string{"CACHE_KEY_PREFIX": "aof:"})})
	pr := startProbe()
	l := newFaultLoad(s, "allow", "rl", "u", 4)
	l.pause = 2 * time.Millisecond
	l.start()
	time.Sleep(time.Second) // stays: load before the shutdown
	// SHUTDOWN writes the AOF and exits; the reply never comes.
	_, _ = valkeytest.Do(vk.Addr, "SHUTDOWN")
	if !waitUntil(5*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", vk.Addr, 50*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err != nil
	}) {
		t.Fatal("valkey still listening 5 s after SHUTDOWN")
	}
	down := time.Now()
	time.Sleep(time.Second) // stays: Valkey stays down this long
	restarting := time.Now()
	vk.Restart()
	back := time.Now()
	time.Sleep(time.Second) // stays: load after the restart
	l.stop()
	pr.finish()

	l.checkNoWrong(t, "load")
	checkLatency(t, "load", l, pr)
	inStore, inPolicy := countIn(l.recs, down, restarting)
	t.Logf("while down: %d answers by the failure policy, %d from Valkey; restart took %v", inPolicy, inStore, back.Sub(restarting))
	if inStore != 0 || inPolicy == 0 {
		t.Errorf("while Valkey was down: %d answers from Valkey (want 0), %d by the policy (want > 0)", inStore, inPolicy)
	}
	rec := recovery(l.recs, back)
	t.Logf("recovered %v after Valkey answered again", rec)
	if stall := pr.stalled(back, back.Add(rec)); rec < 0 || rec > recoveryBound+stall {
		t.Errorf("recovery %v, bound %v + machine stall %v", rec, recoveryBound, stall)
	}
	checkTotals(t, "aof", s, vk.Addr, "aof:", l.sent.Load(), l.abandoned.Load())
	// The absolute expiry survived the restart: window end (next 00:00 UTC)
	// plus the default 300 s grace, to the second.
	keys, err := valkeytest.Do(vk.Addr, "KEYS", counterKeys("aof:"))
	if err != nil || keys == "" {
		t.Fatalf("KEYS: %q %v", keys, err)
	}
	k := keys
	if i := strings.IndexByte(keys, '\n'); i >= 0 {
		k = keys[:i]
	}
	got, err := valkeytest.Do(vk.Addr, "PEXPIRETIME", k)
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := strconv.ParseInt(got, 10, 64)
	now := time.Now().UTC()
	want := now.Truncate(24 * time.Hour).Add(24*time.Hour + 300*time.Second)
	if time.UnixMilli(ms).UTC() != want {
		t.Errorf("expiry of %s after restart = %v, want %v", k, time.UnixMilli(ms).UTC(), want)
	}
}
