package reliability

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// Soak parameters. SOAK_DURATION (a Go duration) lengthens the measured
// phase; SOAK_RATE changes the fixed request rate.
const (
	soakPrincipals      = 100_000
	defaultSoakDuration = 20 * time.Second
	defaultSoakRate     = 2000 // requests per second
	soakWorkers         = 32
	// Flatness bounds: the last third's average may exceed the first
	// third's by at most this fraction or this many bytes, whichever is
	// larger; goroutines by at most soakGoroutineSlack.
	soakGrowth         = 0.10
	soakRSSSlack       = 8 * mib
	soakHeapSlack      = 2 * mib
	soakGoroutineSlack = 20
)

const soakYAML = `domain: soak
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000000000}
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: day, requests_per_unit: 0}
`

// soakReq is principal i's request: every principal has a daily budget
// that is never reached; one in four is on a "free" plan whose limit is 0,
// so its calls are OVER_LIMIT and, after the first, answered by the local
// over-limit cache (its hits charged in background batches).
func soakReq(i int) (*rlpb.RateLimitRequest, bool) {
	u := "p" + strconv.Itoa(i)
	r := &rlpb.RateLimitRequest{Domain: "soak", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: u}}},
	}}
	free := i%4 == 0
	if free {
		r.Descriptors = append(r.Descriptors, &rlcommon.RateLimitDescriptor{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: u}, {Key: "plan", Value: "free"}}})
	}
	return r, free
}

// soakCheck checks one answer. policy reports an answer given by the
// failure policy (allow) after a store timeout rather than from Valkey.
func soakCheck(resp *rlpb.RateLimitResponse, err error, free bool) (policy bool, _ error) {
	if err != nil {
		return false, err
	}
	if len(resp.Statuses) == 0 {
		return false, fmt.Errorf("answer %v without statuses", resp)
	}
	// One store call per request: either every counter came from Valkey
	// (or the over-limit cache), or the whole request got the policy.
	if resp.Statuses[0].LimitRemaining == bigLimit {
		// allow: OK, unless the free plan's counter is known over its
		// limit from the local cache.
		if resp.OverallCode == rlpb.RateLimitResponse_OK || (free && resp.OverallCode == rlpb.RateLimitResponse_OVER_LIMIT) {
			return true, nil
		}
		return true, fmt.Errorf("failure-policy answer %v", resp)
	}
	want := rlpb.RateLimitResponse_OK
	if free {
		want = rlpb.RateLimitResponse_OVER_LIMIT
	}
	if resp.OverallCode != want {
		return false, fmt.Errorf("answer %v, want %v", resp, want)
	}
	return false, nil
}

// hist is a fixed-size latency histogram (buckets 5% apart from 1 us): the
// soak records millions of calls without growing the heap it measures.
type hist struct{ b [400]atomic.Uint64 }

func (h *hist) add(d time.Duration) {
	i := 0
	if us := float64(d) / float64(time.Microsecond); us > 1 {
		i = int(math.Log(us) / math.Log(1.05))
	}
	h.b[min(i, len(h.b)-1)].Add(1)
}

func (h *hist) quantile(q float64) time.Duration {
	var n uint64
	for i := range h.b {
		n += h.b[i].Load()
	}
	target := uint64(math.Ceil(q * float64(n)))
	var c uint64
	for i := range h.b {
		c += h.b[i].Load()
		if c >= target && c > 0 {
			return time.Duration(math.Pow(1.05, float64(i+1)) * float64(time.Microsecond))
		}
	}
	return 0
}

type sample struct {
	at         time.Duration
	rss, heap  uint64
	goroutines int
	calls      uint64
}

func writeHeapProfile(t *testing.T, path string) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Fatal(err)
	}
}

func soakSettings(t *testing.T) (time.Duration, int) {
	d, rate := defaultSoakDuration, defaultSoakRate
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d < 6*time.Second {
			t.Fatalf("SOAK_DURATION=%q: want a duration of at least 6s", v)
		}
	}
	if v := os.Getenv("SOAK_RATE"); v != "" {
		var err error
		if rate, err = strconv.Atoi(v); err != nil || rate <= 0 || rate > 50_000 {
			t.Fatalf("SOAK_RATE=%q: want 1..50000 requests per second", v)
		}
	}
	return d, rate
}

// TestSoak runs the service against Valkey at a fixed request rate over
// 100,000 principals (after a warm-up pass that touches each once) and
// samples resident memory (VmRSS of this process, which runs the service
// and the load generator), the live heap after a GC, and goroutines once a
// second. It asserts no error and no wrong answer, the rate achieved, and
// flatness: the last third's averages within soakGrowth (or the absolute
// slack) of the first third's.
func TestSoak(t *testing.T) {
	dur, rate := soakSettings(t)
	vk := valkeytest.Start(t, valkeytest.Options{})
	dir := t.TempDir()
	writeFile(t, dir, "soak.yaml", soakYAML)
	s := startSvc(t, svcOptions{ConfigDir: dir, Env: merge(valkeyEnv(vk.Addr), map[string]string{"CACHE_KEY_PREFIX": "soak:"}), Conns: 4})

	var (
		errCount atomic.Uint64
		lateErrs atomic.Uint64 // of errCount: the client's deadline passed
		errMu    sync.Mutex
		firstErr error
		calls    atomic.Uint64
		// Calls answered by the failure policy (store deadline missed),
		// preallocated so that recording them does not grow the heap.
		policyMu    sync.Mutex
		policyCalls = resident[span](50_000)
		policyOver  atomic.Uint64
	)
	do := func(w, i int) {
		r, free := soakReq(i)
		ctx, cancel := context.WithTimeout(context.Background(), clientDeadline)
		t0 := time.Now()
		resp, err := s.client(w).ShouldRateLimit(ctx, r)
		t1 := time.Now()
		late := ctx.Err() != nil // the client's deadline passed
		cancel()
		calls.Add(1)
		policy, err := soakCheck(resp, err, free)
		if err != nil {
			if late {
				lateErrs.Add(1)
			}
			if errCount.Add(1) == 1 {
				errMu.Lock()
				firstErr = fmt.Errorf("principal %d: %w", i, err)
				errMu.Unlock()
			}
		}
		if policy {
			policyMu.Lock()
			if len(policyCalls) < cap(policyCalls) {
				policyCalls = append(policyCalls, span{t0, t1})
			} else {
				policyOver.Add(1)
			}
			policyMu.Unlock()
		}
	}
	pr := startProbe()
	vp := startValkeyProbe(t, vk.Addr)
	ctl := startControl(s, "soak", storeTimeout/2)

	// Warm-up: every principal once, closed loop.
	t0 := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < soakWorkers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < soakPrincipals; i = int(next.Add(1)) - 1 {
				do(w, i)
			}
		}(w)
	}
	wg.Wait()
	warm := time.Since(t0)
	t.Logf("warm-up: %d principals in %v", soakPrincipals, warm)

	// Fixed rate: a ticker hands out call slots every 5 ms; workers take
	// them. Slots the workers cannot take in time are counted as missed.
	var h hist
	slots := make(chan int, rate)
	var missed atomic.Uint64
	stop := make(chan struct{})
	for w := 0; w < soakWorkers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := range slots {
				c0 := time.Now()
				do(w, i)
				h.add(time.Since(c0))
			}
		}(w)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Now()
	callsAtStart := calls.Load()
	var samples []sample
	samples = make([]sample, 0, int(dur/time.Second)+2)
	go func() {
		defer close(slots)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		issued := 0
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			due := int(time.Since(start).Seconds() * float64(rate))
			for ; issued < due; issued++ {
				select {
				case slots <- rng.IntN(soakPrincipals):
				default:
					missed.Add(1)
				}
			}
		}
	}()
	profDir := os.Getenv("SOAK_HEAP_PROFILES") // optional: heap profiles at 1/3 and at the end, for pprof -base
	for el := time.Second; el <= dur; el += time.Second {
		time.Sleep(time.Until(start.Add(el))) // stays: paces one sample a second of the soak
		samples = append(samples, sample{at: el, rss: rssBytes(t), heap: heapAfterGC(), goroutines: runtime.NumGoroutine(), calls: calls.Load() - callsAtStart})
		if profDir != "" && (len(samples) == int(dur/time.Second)/3 || el+time.Second > dur) {
			writeHeapProfile(t, filepath.Join(profDir, fmt.Sprintf("heap-%03ds.pprof", int(el.Seconds()))))
		}
	}
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	n := calls.Load() - callsAtStart
	lag99, lagMax := pr.finish()
	ping99, pingMax := vp.finish()
	slowCtl := ctl.finish()

	for _, sm := range samples {
		t.Logf("t=%3.0fs rss %6.1f MiB heap %6.1f MiB goroutines %4d calls %d", sm.at.Seconds(), float64(sm.rss)/mib, float64(sm.heap)/mib, sm.goroutines, sm.calls)
	}
	achieved := float64(n) / elapsed.Seconds()
	t.Logf("fixed rate %d/s for %v: %d calls (%.0f/s), missed slots %d; latency p50 %v p99 %v p99.9 %v; scheduling delay of a probe: p99 %v, max %v; Valkey PING: p99 %v, max %v",
		rate, elapsed.Round(time.Millisecond), n, achieved, missed.Load(), h.quantile(0.5), h.quantile(0.99), h.quantile(0.999), lag99, lagMax, ping99, pingMax)
	// On a machine so loaded that the scheduler is late by half the store
	// deadline for 1% of its wake-ups, whether one call missed the store
	// deadline (or a call the client deadline) by the service's fault
	// or the machine's cannot be told: outside CI those two checks are then
	// skipped, and the test says so. CI=true never skips them.
	overloaded := lag99 >= storeTimeout/2 && os.Getenv("CI") != "true"
	if overloaded {
		t.Logf("machine overloaded (scheduling probe p99 %v >= %v): not failing on failure-policy answers no stall explains, nor on calls past the client deadline (%d); CI=true would", lag99, storeTimeout/2, lateErrs.Load())
	}
	if e := errCount.Load(); e > 0 && (!overloaded || e > lateErrs.Load()) {
		t.Errorf("%d failed or wrong calls (%d past the client deadline); first: %v", e, lateErrs.Load(), firstErr)
	}
	// A call answered by the failure policy missed the store deadline. On
	// this shared machine that happens when other work freezes this
	// process or the valkey-server process for tens of ms or more; each
	// such call must coincide with such a freeze (at least half the store
	// timeout seen by the scheduling probe or the Valkey PING probe), or
	// with a control call (answered without the store) that took at least
	// as long: at load 20-30 the service's own CPU queue delays its
	// goroutines while the one probe goroutine happens to run. They must
	// stay rare.
	// The probes' own p99 delays count towards each call's stall: one
	// probe goroutine (and one PING) samples the machine, and a call's
	// goroutines may wait that long unseen, as checkLatency allows too.
	unexplained := 0
	for _, c := range policyCalls {
		if pr.stalled(c.from, c.to)+vp.stalled(c.from, c.to)+lag99+ping99 < storeTimeout/2 && !overlaps(slowCtl, c) {
			unexplained++
		}
	}
	t.Logf("control calls without the store slower than %v: %d", storeTimeout/2, len(slowCtl))
	m := s.metrics()
	storeErrs := metricSum(m, "ratelimit_store_errors_total")
	t.Logf("answered by the failure policy after a store timeout: %d (%d while this process or Valkey stalled); store errors %v", len(policyCalls)+int(policyOver.Load()), len(policyCalls)-unexplained, storeErrs)
	// The cap is relative to this run: 1% of the calls, plus the calls
	// that can have met a stall the probes measured (stallBudget). On a
	// machine at load 20-30 stalls explain several percent of the calls;
	// a service that misses deadlines by itself fails either way, as its
	// answers are unexplained.
	stalls := merged(append(append(pr.stalls(storeTimeout/2), vp.stalls(storeTimeout/2)...), slowCtl...))
	budget := stallBudget(stalls, soakWorkers, float64(calls.Load())/time.Since(t0).Seconds())
	policyCap := 0.01*float64(calls.Load()) + float64(budget)
	t.Logf("failure-policy cap: 1%% of %d calls + %d that can have met a measured stall = %.0f", calls.Load(), budget, policyCap)
	if (unexplained > 0 && !overloaded) || policyOver.Load() > 0 || float64(len(policyCalls)) > policyCap {
		t.Errorf("%d calls answered by the failure policy (%d with no machine stall during them; %d beyond the record): want none unexplained and at most %.0f",
			len(policyCalls)+int(policyOver.Load()), unexplained, policyOver.Load(), policyCap)
	}
	// The rate is relative to the time this process could run: the ticker
	// and the workers are this process's goroutines, and the scheduling
	// probe measures how long it was kept waiting.
	stalled := pr.stalled(start, start.Add(elapsed))
	runnable := max(1-stalled.Seconds()/elapsed.Seconds(), 0)
	t.Logf("rate bound: 90%% of %d/s over the %.0f%% of the run this process was not stalled (stalled %v)", rate, 100*runnable, stalled.Round(time.Millisecond))
	if achieved < 0.9*float64(rate)*runnable {
		t.Errorf("achieved %.0f/s of %d/s (%d slots missed; this process stalled %v of %v): the service did not keep up", achieved, rate, missed.Load(), stalled, elapsed)
	}
	if st := readStoreStats(m); st.lost != 0 || st.expired != 0 {
		t.Errorf("hits lost during the soak: %+v", st)
	}
	// The first seconds after the warm-up pass are left out: the runtime is
	// still returning the warm-up's garbage to the OS (RSS falls).
	settled := samples[max(3, len(samples)/10):]
	third := len(settled) / 3
	first, last := settled[:third], settled[len(settled)-third:]
	avg := func(ss []sample, f func(sample) float64) float64 {
		var sum float64
		for _, s := range ss {
			sum += f(s)
		}
		return sum / float64(len(ss))
	}
	for _, c := range []struct {
		name  string
		f     func(sample) float64
		slack float64
	}{
		{"rss", func(s sample) float64 { return float64(s.rss) }, soakRSSSlack},
		{"heap", func(s sample) float64 { return float64(s.heap) }, soakHeapSlack},
	} {
		a, b := avg(first, c.f), avg(last, c.f)
		bound := a + max(soakGrowth*a, c.slack)
		t.Logf("%s: first third %.1f MiB, last third %.1f MiB (bound %.1f MiB)", c.name, a/mib, b/mib, bound/mib)
		if b > bound {
			t.Errorf("%s grew: first third %.1f MiB, last third %.1f MiB, bound %.1f MiB", c.name, a/mib, b/mib, bound/mib)
		}
	}
	maxG := func(ss []sample) int {
		m := 0
		for _, s := range ss {
			m = max(m, s.goroutines)
		}
		return m
	}
	if g1, g2 := maxG(first), maxG(last); g2 > g1+soakGoroutineSlack {
		t.Errorf("goroutines grew: first third max %d, last third max %d", g1, g2)
	}
}
