package reliability

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// floodWorkers is how many goroutines flood calls from.
const floodWorkers = 16

// flood sends one call for each of n new principals (prefix + i) over 16
// goroutines and passes every answer to check.
func flood(t *testing.T, s *svc, prefix string, n int, check func(i int, resp *rlpb.RateLimitResponse, err error)) {
	t.Helper()
	var wg sync.WaitGroup
	for w := 0; w < floodWorkers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += floodWorkers {
				ctx, cancel := context.WithTimeout(context.Background(), clientDeadline)
				resp, err := s.client(w).ShouldRateLimit(ctx, req("rl", "user", prefix+strconv.Itoa(i)))
				cancel()
				check(i, resp, err)
			}
		}(w)
	}
	wg.Wait()
}

// seriesLines returns the metric sample lines (no comments), to show that
// new principals add no series.
func seriesLines(text string) []string {
	return seriesLinesFrom(text)
}

// newSeries checks that the second scrape adds no series per principal: a
// series whose labels name a flooded principal, or more new series than a
// handful of outcome classes can explain (a per-principal leak adds one per
// principal: thousands here). A failure-policy answer under load legitimately
// adds its outcome series (ratelimit_failure_policy_total{policy=...} and
// friends) the first time one happens.
func newSeries(t *testing.T, before, after []string, principalPrefixes ...string) {
	t.Helper()
	seen := map[string]bool{}
	for _, l := range before {
		seen[l] = true
	}
	var added []string
	for _, l := range after {
		if !seen[l] {
			added = append(added, l)
		}
		for _, p := range principalPrefixes {
			if strings.Contains(l, p) {
				t.Errorf("a principal's value appears in a metric series: %s", l)
			}
		}
	}
	if len(added) > 16 {
		t.Errorf("%d new metric series after the second flood (series per principal?), first: %v", len(added), added[:16])
	} else if len(added) > 0 {
		t.Logf("new outcome series after the second flood: %v", added)
	}
}

func seriesLinesFrom(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, "go_") && !strings.HasPrefix(l, "process_") {
			out = append(out, l[:strings.LastIndexByte(l, ' ')])
		}
	}
	return out
}

// TestCardinalityFloodMemoryStore: a flood of requests, each with a new
// principal, against the embedded memory store bounded by
// MEMORY_MAX_COUNTERS. Up to the bound every principal gets its counter;
// beyond it a call that needs a new counter is refused by the store, counted
// in ratelimit_memory_refused_total, and answered by MEMORY_FULL_POLICY: deny
// (the default: OVER_LIMIT although FAILURE_POLICY is allow, so the bound
// still enforces) or failure-policy (allow: OK without counting, as before
// issue 16; deny: OVER_LIMIT). Existing
// principals keep counting exactly. The live heap stops growing at the
// bound, and no metric series is added per principal.
func TestCardinalityFloodMemoryStore(t *testing.T) {
	const bound = 20_000
	for _, tc := range []struct{ full, policy string }{{"", "allow"}, {"failure-policy", "allow"}, {"failure-policy", "deny"}} {
		policy := tc.policy
		// What a refused request gets: OK uncounted only when the failure
		// policy answers and allows.
		refusedOK := tc.full == "failure-policy" && policy == "allow"
		policyLabel := policy
		if tc.full == "" {
			policyLabel = "store_full_deny"
		}
		t.Run("full="+tc.full+"/"+policy, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, "rl.yaml", "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 3}\n  - key: team\n    rate_limit: {unit: day, requests_per_unit: 1000000000}\n")
			s := startSvc(t, svcOptions{ConfigDir: dir, Env: map[string]string{"MEMORY_MAX_COUNTERS": strconv.Itoa(bound), "FAILURE_POLICY": policy, "MEMORY_FULL_POLICY": tc.full,
				// The bound is under test, not latency: a long store deadline
				// keeps a loaded machine's slow calls from being answered by
				// the failure policy and mistaken for refusals.
				"STORE_TIMEOUT": "2s"}, Conns: 4})
			victim := req("rl", "user", "victim")
			for i := 0; i < 2; i++ {
				if resp := call(t, s, victim); resp.OverallCode != rlpb.RateLimitResponse_OK {
					t.Fatalf("victim call %d: %v", i, resp)
				}
			}
			team := req("rl", "team", "blue")
			if resp := call(t, s, team); resp.Statuses[0].LimitRemaining >= bigLimit {
				t.Fatalf("team call before the flood: %v", resp)
			}
			h0 := heapAfterGC()
			// Phase 1: 30,000 new principals; the first bound-2 get counters.
			var mu sync.Mutex
			counted, refused, bad := 0, 0, 0
			var firstBad string
			check := func(i int, resp *rlpb.RateLimitResponse, err error) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && resp.OverallCode == rlpb.RateLimitResponse_OK && resp.Statuses[0].LimitRemaining == 2:
					counted++ // the store's answer: 1 of 3 used
				case err == nil && refusedOK && resp.OverallCode == rlpb.RateLimitResponse_OK && resp.Statuses[0].LimitRemaining == 3:
					refused++ // the failure policy's answer
				case err == nil && !refusedOK && resp.OverallCode == rlpb.RateLimitResponse_OVER_LIMIT:
					refused++
				default:
					if bad++; bad == 1 {
						firstBad = strings.TrimSpace(resp.String() + " " + errString(err))
					}
				}
			}
			flood(t, s, "flood1-", 30_000, check)
			h1 := heapAfterGC()
			m1 := s.metrics()
			if bad != 0 || counted != bound-2 || refused != 30_000-(bound-2) {
				t.Fatalf("phase 1: %d counted (want %d), %d refused (want %d), %d wrong (first: %s)", counted, bound-2, refused, 30_000-(bound-2), bad, firstBad)
			}
			if got := metric(m1, "ratelimit_memory_counters"); got != bound {
				t.Fatalf("ratelimit_memory_counters = %v, want the bound %d", got, bound)
			}
			// Phase 2: 30,000 more; all refused, nothing grows. Meanwhile an
			// existing principal (team blue, counter made before the flood)
			// keeps being counted: none of its calls may get the policy.
			counted, refused = 0, 0
			victimDone := make(chan [2]int)
			go func() {
				var stored, policied int
				for i := 0; i < 300; i++ {
					resp, err := s.client(i).ShouldRateLimit(context.Background(), team)
					if err == nil && resp.OverallCode == rlpb.RateLimitResponse_OK && resp.Statuses[0].LimitRemaining < bigLimit {
						stored++
					} else {
						policied++
					}
				}
				victimDone <- [2]int{stored, policied}
			}()
			flood(t, s, "flood2-", 30_000, check)
			v := <-victimDone
			if v[1] != 0 {
				t.Errorf("an existing principal's calls during the flood: %d counted, %d answered by the failure policy (want 0): the flood spilled onto it", v[0], v[1])
			}
			h2 := heapAfterGC()
			m2 := s.metrics()
			if bad != 0 || counted != 0 || refused != 30_000 {
				t.Fatalf("phase 2: %d counted, %d refused, %d wrong (first: %s)", counted, refused, bad, firstBad)
			}
			// Every refused request is answered by the policy and counted
			// there exactly; the store counts refused calls (a batch of
			// several requests refused whole, then charged one by one,
			// counts more than once).
			wantRefused := float64(30_000 - (bound - 2) + 30_000)
			if got := metric(m2, `ratelimit_failure_policy_total{policy="`+policyLabel+`"}`); got != wantRefused {
				t.Fatalf("ratelimit_failure_policy_total = %v, want %v", got, wantRefused)
			}
			if got := metric(m2, "ratelimit_memory_refused_total"); got < wantRefused {
				t.Fatalf("ratelimit_memory_refused_total = %v, want at least %v", got, wantRefused)
			}
			// The victim's counter keeps counting exactly: 3rd hit OK, 4th over.
			if resp := call(t, s, victim); resp.OverallCode != rlpb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
				t.Fatalf("victim's 3rd hit during the flood: %v", resp)
			}
			if resp := call(t, s, victim); resp.OverallCode != rlpb.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("victim's 4th hit during the flood: %v", resp)
			}
			t.Logf("live heap: %.1f MiB before, %.1f MiB at the bound (%.0f B per counter), %.1f MiB after 30,000 more principals",
				float64(h0)/mib, float64(h1)/mib, (float64(h1)-float64(h0))/bound, float64(h2)/mib)
			if h1 > h0+bound*512 {
				t.Errorf("heap grew by %.1f MiB for %d counters: more than 512 B each", float64(h1-h0)/mib, bound)
			}
			if h2 > h1+2*mib {
				t.Errorf("heap grew from %.1f to %.1f MiB beyond the bound", float64(h1)/mib, float64(h2)/mib)
			}
			newSeries(t, seriesLines(m1), seriesLines(m2), `"flood`)
			if strings.Contains(m2, "flood") {
				t.Error("a principal's value appears in /metrics")
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestCardinalityFloodValkey: with Valkey, a flood of new principals that
// are each over their limit (limit 0) fills the local over-limit cache to
// OVER_LIMIT_CACHE_SIZE and no further: later principals are answered from
// Valkey (still OVER_LIMIT, still charged), the live heap stops growing,
// no metric series is added per principal, and every hit is in Valkey. The
// Valkey store keeps nothing per counter (a counter's expiry is set by the
// charge script that creates it), so once the cache is full after the first
// flood the second may not grow the heap at all.
func TestCardinalityFloodValkey(t *testing.T) {
	const cacheSize = 5000
	vk := valkeytest.Start(t, valkeytest.Options{})
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 0}\n")
	s := startSvc(t, svcOptions{ConfigDir: dir, Env: merge(valkeyEnv(vk.Addr), map[string]string{
		"OVER_LIMIT_CACHE_SIZE": strconv.Itoa(cacheSize), "CACHE_KEY_PREFIX": "card:"}), Conns: 4})
	var mu sync.Mutex
	bad := 0
	var firstBad string
	check := func(i int, resp *rlpb.RateLimitResponse, err error) {
		if err == nil && resp.OverallCode == rlpb.RateLimitResponse_OVER_LIMIT {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if bad++; bad == 1 {
			firstBad = resp.String() + " " + errString(err)
		}
	}
	pr, vp := startProbe(), startValkeyProbe(t, vk.Addr)
	started := time.Now()
	h0 := heapAfterGC()
	flood(t, s, "c1-", 3*cacheSize, check)
	h1 := heapAfterGC()
	m1 := s.metrics()
	flood(t, s, "c2-", 3*cacheSize, check)
	h2 := settledHeap(h1+2*mib, 5*time.Second)
	m2 := s.metrics()
	// On a loaded machine a call can miss the engine's store deadline and be
	// answered by the failure policy (allow): that is the designed outage
	// answer, counted in ratelimit_failure_policy_total, not a cache bug. Every
	// answer that is not OVER_LIMIT must be such a counted policy answer, and
	// they stay rare; the hit is still in Valkey (checked below).
	// The cap is relative to this run: 1% of the calls plus those that can
	// have met a stall of this process or of Valkey that the probes
	// measured meanwhile (stallBudget; at load 20-30 that is several
	// percent).
	took := time.Since(started)
	pr.finish()
	vp.finish()
	budget := stallBudget(merged(append(pr.stalls(storeTimeout/2), vp.stalls(storeTimeout/2)...)), floodWorkers, float64(6*cacheSize)/took.Seconds())
	policyCap := 6*cacheSize/100 + budget
	policy := int(metricSum(m2, "ratelimit_failure_policy_total"))
	if bad > policy || policy > policyCap {
		t.Fatalf("%d answers not OVER_LIMIT, %d answered by the failure policy (want every non-OVER_LIMIT answer to be a counted policy answer, at most 1%% + %d that can have met a measured stall); first: %s", bad, policy, budget, firstBad)
	}
	if bad > 0 {
		t.Logf("%d answers from the failure policy after a missed store deadline (machine load)", bad)
	}
	full := metric(m2, `ratelimit_over_limit_cache_total{result="full"}`)
	t.Logf("live heap: %.1f MiB before, %.1f MiB after %d principals, %.1f MiB after %d more; over-limit cache full %v times",
		float64(h0)/mib, float64(h1)/mib, 3*cacheSize, float64(h2)/mib, 3*cacheSize, full)
	if full < float64(3*cacheSize) {
		t.Errorf("over-limit cache refused %v inserts; with %d principals over a %d-entry cache want at least %d", full, 6*cacheSize, cacheSize, 3*cacheSize)
	}
	if h2 > h1+2*mib {
		t.Errorf("heap grew from %.1f to %.1f MiB though the cache was full", float64(h1)/mib, float64(h2)/mib)
	}
	newSeries(t, seriesLines(m1), seriesLines(m2), `"c1-`, `"c2-`)
	if total, keys := sumKeys(t, vk.Addr, "card:"); total != 6*cacheSize || keys != 6*cacheSize {
		t.Errorf("Valkey: %d hits in %d keys, want %d in %d", total, keys, 6*cacheSize, 6*cacheSize)
	}
}

// TestOversizedRequests: requests beyond the engine's bounds (512
// descriptors, 256 entries per descriptor, 8 KiB per key, value or domain)
// are refused with InvalidArgument; messages above gRPC's 4 MiB receive
// limit with ResourceExhausted, before they are decoded; /json bodies above
// 4 MiB with 400. None of it costs lasting memory, nothing is charged, and
// the service answers normally afterwards.
func TestOversizedRequests(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n")
	s := startSvc(t, svcOptions{ConfigDir: dir})
	if resp := call(t, s, req("rl", "user", "a")); resp.OverallCode != rlpb.RateLimitResponse_OK {
		t.Fatalf("normal call: %v", resp)
	}
	h0 := heapAfterGC()
	oversized(t, s)
	h1 := heapAfterGC()
	t.Logf("live heap: %.1f MiB before the oversized requests, %.1f MiB after", float64(h0)/mib, float64(h1)/mib)
	if h1 > h0+4*mib {
		t.Errorf("live heap grew from %.1f to %.1f MiB", float64(h0)/mib, float64(h1)/mib)
	}
	if resp := call(t, s, req("rl", "user", "a")); resp.OverallCode != rlpb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 98 {
		t.Fatalf("normal call after the oversized ones: %v (want OK, 98 remaining: nothing was charged by refused requests)", resp)
	}
}

func entriesReq(n int) *rlpb.RateLimitRequest {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i < n; i++ {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: "user", Value: strconv.Itoa(i)})
	}
	return &rlpb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{d}}
}

func descriptorsReq(n int) *rlpb.RateLimitRequest {
	r := &rlpb.RateLimitRequest{Domain: "rl"}
	for i := 0; i < n; i++ {
		r.Descriptors = append(r.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: strconv.Itoa(i)}}})
	}
	return r
}

// oversized sends the oversized requests, each built when sent so that
// none is referenced once it returns, and checks the codes.
func oversized(t *testing.T, s *svc) {
	t.Helper()
	mb := strings.Repeat("x", 1<<20)
	for _, c := range []struct {
		name string
		mk   func() *rlpb.RateLimitRequest
		want codes.Code
	}{
		{"5,000 entries", func() *rlpb.RateLimitRequest { return entriesReq(5000) }, codes.InvalidArgument},
		{"2,000 descriptors", func() *rlpb.RateLimitRequest { return descriptorsReq(2000) }, codes.InvalidArgument},
		{"1 MiB key", func() *rlpb.RateLimitRequest { return req("rl", mb, "v") }, codes.InvalidArgument},
		{"64 KiB domain", func() *rlpb.RateLimitRequest { return req(strings.Repeat("d", 64<<10), "user", "v") }, codes.InvalidArgument},
		{"100,000 descriptors (3.9 MB)", func() *rlpb.RateLimitRequest { return descriptorsReq(100_000) }, codes.InvalidArgument},
		{"5 MiB value (message above 4 MiB)", func() *rlpb.RateLimitRequest { return req("rl", "user", strings.Repeat(mb, 5)) }, codes.ResourceExhausted},
		{"64 MiB message", func() *rlpb.RateLimitRequest { return req("rl", "user", strings.Repeat(mb, 64)) }, codes.ResourceExhausted},
	} {
		_, err := s.client(0).ShouldRateLimit(context.Background(), c.mk())
		if status.Code(err) != c.want {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
			continue
		}
		msg := status.Convert(err).Message()
		t.Logf("%s: %s: %s", c.name, status.Code(err), msg[:min(100, len(msg))])
	}
	// Twenty 3.9 MB requests at once: all refused.
	var wg sync.WaitGroup
	var codesMu sync.Mutex
	got := map[codes.Code]int{}
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, err := s.client(i).ShouldRateLimit(context.Background(), descriptorsReq(100_000))
			codesMu.Lock()
			got[status.Code(err)]++
			codesMu.Unlock()
		}(i)
	}
	wg.Wait()
	if got[codes.InvalidArgument] != 20 {
		t.Errorf("20 concurrent 3.9 MB requests: codes %v, want 20 InvalidArgument", got)
	}
	// /json: a body above 4 MiB is 400.
	body := `{"domain":"rl","descriptors":[{"entries":[{"key":"user","value":"` + strings.Repeat(mb, 5) + `"}]}]}`
	resp, err := http.Post(s.httpURL+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("/json 5 MiB body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("/json 5 MiB body: status %d, want 400", resp.StatusCode)
	}
}

// TestLongValuesCounted: a principal whose identity value is 1 MiB long is
// counted, under a digest of the value, not refused: a refusal is a service
// error, which Envoy and agentgateway answer by letting the request through
// (fail open), so a long identity would run unbudgeted (the reference counts
// it too). Two long values that differ count apart; over gRPC and /json.
func TestLongValuesCounted(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n")
	// A 1 MiB request under load can outlast the default 15 ms store
	// deadline, whose failure policy answer would read as a lost count.
	s := startSvc(t, svcOptions{ConfigDir: dir, Env: map[string]string{"STORE_TIMEOUT": "5s"}})
	mb := strings.Repeat("x", 1<<20)
	other := mb[:len(mb)-1] + "y"
	h0 := heapAfterGC()
	for i, c := range []struct {
		value string
		want  uint32
	}{{mb, 99}, {mb, 98}, {other, 99}, {mb, 97}} {
		resp := call(t, s, req("rl", "user", c.value))
		if resp.OverallCode != rlpb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != c.want {
			t.Fatalf("call %d with a 1 MiB value: %v, want OK with %d remaining", i, resp, c.want)
		}
	}
	body := `{"domain":"rl","descriptors":[{"entries":[{"key":"user","value":"` + mb + `"}]}]}`
	resp, err := http.Post(s.httpURL+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(out), `"limitRemaining":96`) {
		t.Errorf("/json with a 1 MiB value: %d %s, want 200 with 96 remaining", resp.StatusCode, out)
	}
	if h1 := heapAfterGC(); h1 > h0+4*mib {
		t.Errorf("live heap grew from %.1f to %.1f MiB: long values must not be kept", float64(h0)/mib, float64(h1)/mib)
	}
}

// TestLongValuesEveryStoreAndFormat: in both stores and both key formats, a
// long value is one principal, counted apart from a short value that spells
// its digest, and it is the same counter after a restart (the embedded
// store's snapshot) and on a second replica (Valkey).
func TestLongValuesEveryStoreAndFormat(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n")
	long := strings.Repeat("x", key.MaxValueBytes+1)
	vk := valkeytest.Start(t, valkeytest.Options{})
	for _, format := range key.FormatNames {
		for _, st := range []string{"memory", "valkey"} {
			t.Run(st+"/"+format, func(t *testing.T) {
				env := map[string]string{"KEY_FORMAT": format, "XDG_STATE_HOME": t.TempDir()}
				if st == "valkey" {
					env = merge(env, valkeyEnv(vk.Addr), map[string]string{"CACHE_KEY_PREFIX": format + "_"})
				}
				first := startSvc(t, svcOptions{ConfigDir: dir, Env: env})
				for i, c := range []struct {
					value string
					want  uint32
				}{{long, 99}, {key.Digest(long), 99}, {long, 98}} {
					if got := call(t, first, req("rl", "user", c.value)).Statuses[0].LimitRemaining; got != c.want {
						t.Fatalf("call %d: %d remaining, want %d", i, got, c.want)
					}
				}
				if st == "memory" {
					if err := first.stop(); err != nil {
						t.Fatal(err)
					}
				}
				second := startSvc(t, svcOptions{ConfigDir: dir, Env: env})
				if got := call(t, second, req("rl", "user", long)).Statuses[0].LimitRemaining; got != 97 {
					t.Fatalf("the long value on the next service: %d remaining, want 97", got)
				}
			})
		}
	}
}
