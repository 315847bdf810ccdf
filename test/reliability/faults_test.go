package reliability

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

const budgetsYAML = `domain: rl
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000000000}
`

var policies = []string{"allow", "deny", "error"}

// TestServiceValkeyKilled: three services (FAILURE_POLICY allow, deny and
// error) share one Valkey (AOF, fsync always) under load; Valkey is
// SIGKILLed for 5 s and started again. Every call is answered within the
// bounds, by the failure policy while Valkey is down and from Valkey after,
// each service recovers within 1 s without a restart, and the charges made
// during the outage land in Valkey: the totals lie in [sent - ambiguous,
// sent] with nothing lost from the buffer.
func TestServiceValkeyKilled(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{Args: []string{"--appendonly", "yes", "--appendfsync", "always"}})
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", budgetsYAML)
	loads := map[string]*faultLoad{}
	svcs := map[string]*svc{}
	for _, p := range policies {
		s := startSvc(t, svcOptions{ConfigDir: dir, Env: merge(valkeyEnv(vk.Addr), map[string]string{
			"FAILURE_POLICY": p, "CACHE_KEY_PREFIX": p + ":",
		})})
		svcs[p] = s
		loads[p] = newFaultLoad(s, p, "rl", "u", 4)
	}
	pr := startProbe()
	for _, l := range loads {
		l.start()
	}
	// stays: load before the kill
	time.Sleep(time.Second)
	vk.Kill() // returns once the port is closed
	down := time.Now()
	time.Sleep(5 * time.Second) // stays: the outage lasts 5 s
	restarting := time.Now()
	vk.Restart() // returns once Valkey answers PING
	back := time.Now()
	time.Sleep(1500 * time.Millisecond) // stays: load after the restart
	for _, l := range loads {
		l.stop()
	}
	pr.finish()
	t.Logf("valkey down for %v; restart took %v", restarting.Sub(down), back.Sub(restarting))

	for _, p := range policies {
		l, s := loads[p], svcs[p]
		t.Run(p, func(t *testing.T) {
			l.checkNoWrong(t, p)
			checkLatency(t, p, l, pr)
			inStore, inPolicy := countIn(l.recs, down, restarting)
			t.Logf("%s: while down: %d answers by the failure policy, %d from Valkey", p, inPolicy, inStore)
			for _, r := range l.recs {
				if r.kind == fromStore && !r.start.Before(down) && r.start.Add(r.lat).Before(restarting) {
					t.Logf("%s: answer from Valkey for a call started %v after the kill, took %v", p, r.start.Sub(down), r.lat)
				}
			}
			if inStore != 0 || inPolicy < 100 {
				t.Errorf("%s: while Valkey was down: %d answers from Valkey (want 0), %d by the policy (want >= 100)", p, inStore, inPolicy)
			}
			rec := recovery(l.recs, back)
			t.Logf("%s: recovered %v after Valkey answered again", p, rec)
			if stall := pr.stalled(back, back.Add(rec)); rec < 0 || rec > recoveryBound+stall {
				t.Errorf("%s: recovery %v, bound %v + machine stall %v", p, rec, recoveryBound, stall)
			}
			st := checkTotals(t, p, s, vk.Addr, p+":", l.sent.Load(), l.abandoned.Load())
			if st.buffered == 0 {
				t.Errorf("%s: nothing was buffered during a 5 s outage under load", p)
			}
		})
	}
}

// TestServiceValkeyStalled: Valkey is SIGSTOPped for 5 s while a load runs
// and a burst of 5,000 calls (50 waves of 100, more than valkey-go's 4 x 1024
// ring slots) arrives. Calls keep the same bounds; the burst is compared
// with control goroutines started in the same waves that only wait for the
// store deadline; the peak of goroutines is bounded; afterwards goroutines
// and heap return to their baseline and the totals are within the
// bookkeeping bounds.
func TestServiceValkeyStalled(t *testing.T) {
	vk := valkeytest.Start(t, valkeytest.Options{})
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", budgetsYAML)
	s := startSvc(t, svcOptions{ConfigDir: dir, Env: merge(valkeyEnv(vk.Addr), map[string]string{"CACHE_KEY_PREFIX": "stall:"}), Conns: 4})
	// Warm the service and the client connections, then take the baseline.
	for i := 0; i < 50; i++ {
		if _, err := s.client(i).ShouldRateLimit(context.Background(), req("rl", "user", "warm")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond) // stays: settle before the baseline (the bounds below are relative to it)
	g0, h0 := runtime.NumGoroutine(), heapAfterGC()

	var peakG atomic.Int64
	samplerStop := make(chan struct{})
	var samplerWG sync.WaitGroup
	samplerWG.Add(1)
	go func() {
		defer samplerWG.Done()
		for {
			select {
			case <-samplerStop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if n := int64(runtime.NumGoroutine()); n > peakG.Load() {
				peakG.Store(n)
			}
		}
	}()

	pr := startProbe()
	l := newFaultLoad(s, "allow", "rl", "u", 4).start()
	time.Sleep(500 * time.Millisecond) // stays: load before the stall
	vk.Stop()
	waitUnresponsive(t, vk.Addr)
	stopped := time.Now()
	time.Sleep(100 * time.Millisecond) // stays: the stall has lasted a while before the burst

	// Two controls run in the same waves as the burst, so its bounds are
	// relative to this run: goroutines that only sleep the store deadline
	// (the timer wake-up of thousands of goroutines), and gRPC calls of a
	// descriptor no rule matches, which the service answers without the
	// store (the gRPC and CPU queueing of the burst's calls; on a loaded
	// machine that, not the deadline, dominates). alive counts the burst's
	// goroutines, for the goroutine bound.
	const waves, perWave, grpcPerWave = 50, 100, 25
	var (
		burstMu     sync.Mutex
		burst       []callRec
		control     []time.Duration
		grpcControl []time.Duration
		burstSent   atomic.Uint64
		burstWG     sync.WaitGroup
		alive       atomic.Int64
		aliveMax    atomic.Int64
	)
	enter := func() {
		n := alive.Add(1)
		for m := aliveMax.Load(); n > m && !aliveMax.CompareAndSwap(m, n); m = aliveMax.Load() {
		}
	}
	burstLoad := &faultLoad{policy: "allow"} // for wrong-answer reporting
	for w := 0; w < waves; w++ {
		for i := 0; i < grpcPerWave; i++ {
			burstWG.Add(1)
			n := w*grpcPerWave + i
			enter()
			go func() {
				defer burstWG.Done()
				defer alive.Add(-1)
				ctx, cancel := context.WithTimeout(context.Background(), clientDeadline)
				defer cancel()
				t0 := time.Now()
				_, err := s.client(n).ShouldRateLimit(ctx, req("rl", "unmatched", "control"))
				d := time.Since(t0)
				if err != nil {
					burstLoad.fail("gRPC control call %d: %v", n, err)
				}
				burstMu.Lock()
				grpcControl = append(grpcControl, d)
				burstMu.Unlock()
			}()
		}
		for i := 0; i < perWave; i++ {
			burstWG.Add(2)
			n := w*perWave + i
			enter()
			enter()
			go func() {
				defer burstWG.Done()
				defer alive.Add(-1)
				ctx, cancel := context.WithTimeout(context.Background(), clientDeadline)
				defer cancel()
				t0 := time.Now()
				resp, err := s.client(n).ShouldRateLimit(ctx, req("rl", "user", "burst"+strconv.Itoa(n)))
				lat := time.Since(t0)
				kind, _, why := classify("allow", resp, err)
				if kind == wrong {
					burstLoad.fail("burst call %d: %s", n, why)
					if abandonedByClient(err) {
						burstLoad.abandoned.Add(1)
					}
				} else {
					burstSent.Add(1)
				}
				burstMu.Lock()
				burst = append(burst, callRec{start: t0, lat: lat, kind: kind})
				burstMu.Unlock()
			}()
			go func() {
				defer burstWG.Done()
				defer alive.Add(-1)
				t0 := time.Now()
				time.Sleep(storeTimeout) // stays: the control, a goroutine sleeping the store timeout
				d := time.Since(t0)
				burstMu.Lock()
				control = append(control, d)
				burstMu.Unlock()
			}()
		}
		time.Sleep(10 * time.Millisecond) // stays: spaces the burst's waves
	}
	burstWG.Wait()
	burstDone := time.Now()
	if rest := 5*time.Second - time.Since(stopped); rest > 0 {
		time.Sleep(rest) // stays: the stall lasts 5 s
	}
	resuming := time.Now()
	vk.Cont()
	back := time.Now()
	time.Sleep(time.Second) // stays: load after the stall ends
	l.stop()
	lag99, lagMax := pr.finish()
	t.Logf("valkey stopped for %v; burst of %d calls took %v", back.Sub(stopped), waves*perWave, burstDone.Sub(stopped))

	l.checkNoWrong(t, "load")
	burstLoad.checkNoWrong(t, "burst")
	checkLatency(t, "load", l, pr)
	inStore, inPolicy := countIn(l.recs, stopped, resuming)
	t.Logf("load while stalled: %d answers by the failure policy, %d from Valkey", inPolicy, inStore)
	if inStore != 0 {
		for _, r := range l.recs {
			if r.kind == fromStore && !r.start.Before(stopped) && r.start.Add(r.lat).Before(resuming) {
				t.Logf("answer from Valkey for a call started %v after SIGSTOP took effect, took %v", r.start.Sub(stopped), r.lat)
			}
		}
		t.Errorf("%d answers from a stopped Valkey", inStore)
	}
	bs, bp := countIn(burst, stopped, resuming)
	if bs != 0 || bp != waves*perWave {
		t.Errorf("burst: %d from Valkey, %d by the policy; want 0 and %d", bs, bp, waves*perWave)
	}
	blat := make([]time.Duration, len(burst))
	for i, r := range burst {
		blat[i] = r.lat
	}
	bp99, bmax := pct(blat, 99), pct(blat, 100)
	cp99, cmax := pct(control, 99), pct(control, 100)
	gp99, gmax := pct(grpcControl, 99), pct(grpcControl, 100)
	t.Logf("burst: p50 %v, p99 %v, max %v; controls in the same waves: sleep %v p99 %v, max %v; gRPC without the store p99 %v, max %v",
		pct(blat, 50), bp99, bmax, storeTimeout, cp99, cmax, gp99, gmax)
	if bp99 > cp99+gp99+burstP99Slack+lag99 || bmax > cmax+gmax+burstMaxSlack+lagMax {
		t.Errorf("burst calls outlived the deadline: p99 %v (controls %v + %v + %v + probe p99 %v), max %v (controls %v + %v + %v + probe max %v)",
			bp99, cp99, gp99, burstP99Slack, lag99, bmax, cmax, gmax, burstMaxSlack, lagMax)
	}
	rec := recovery(l.recs, back)
	t.Logf("recovered %v after SIGCONT", rec)
	if stall := pr.stalled(back, back.Add(rec)); rec < 0 || rec > recoveryBound+stall {
		t.Errorf("recovery %v, bound %v + machine stall %v", rec, recoveryBound, stall)
	}

	// Goroutines: the peak is bounded by the calls in flight (client and
	// server side) plus the store's MaxInFlight detached calls; afterwards
	// back to the baseline.
	close(samplerStop)
	samplerWG.Wait()
	// The burst's own goroutines in flight are about four waves' worth on
	// an idle machine; on a loaded one the calls last longer and more waves
	// overlap, so the bound takes the most that were alive at once in this
	// run when that is more (twice: each call has a server side too).
	const maxInFlight = 256 // valkey.DefaultMaxInFlight
	callers := max(2*4*perWave, 2*aliveMax.Load())
	peakBound := int64(g0) + callers + int64(2*l.workers+2*maxInFlight+50)
	t.Logf("goroutines: baseline %d, peak %d (bound %d; burst goroutines alive at once: at most %d)", g0, peakG.Load(), peakBound, aliveMax.Load())
	if peakG.Load() > peakBound {
		t.Errorf("goroutine peak %d above %d", peakG.Load(), peakBound)
	}
	var g1 int
	if !waitUntil(5*time.Second, func() bool { g1 = runtime.NumGoroutine(); return g1 <= g0+5 }) {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines %d, baseline %d: not back within 5 s\n%s", g1, g0, buf[:runtime.Stack(buf, true)])
	}
	h1 := heapAfterGC()
	t.Logf("heap after GC: baseline %.1f MiB, after %.1f MiB; goroutines after %d", float64(h0)/mib, float64(h1)/mib, g1)
	if h1 > h0+8*mib {
		t.Errorf("heap %.1f MiB, baseline %.1f MiB: grew by more than 8 MiB", float64(h1)/mib, float64(h0)/mib)
	}
	checkTotals(t, "stall", s, vk.Addr, "stall:", l.sent.Load()+burstSent.Load()+50, l.abandoned.Load()+burstLoad.abandoned.Load())
}
