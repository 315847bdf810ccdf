package reliability

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// The fault suite: one Valkey fault per case, each injected under a load of
// 64 workers on the whole service (service.Run) with its default settings
// (no STORE_TIMEOUT, no store option set: exactly-once charging is the only
// path), then ended. Once the outage buffer has drained, every case asserts
// the same accounting, from the service's exported metrics (views of the
// store's tally, internal/store/accounting.go):
//
//   - nothing lost, expired, dropped from the buffer or given up while
//     ambiguous (ratelimit_valkey_lost_hits_total counts Lost and
//     BufferLost; ratelimit_valkey_ambiguous_dropped_hits_total), nor
//     dropped, refused or saturated by the charger;
//   - nothing still waiting: every buffered hit replayed, every ambiguous
//     hit resolved as found applied or replayed (the tally's Waiting = 0);
//   - Valkey holds exactly the hits the service charged: every call it
//     answered, from Valkey or by the failure policy, charged its hit once.
//     A call the client abandoned (none expected) may add one.
//
// FLUSHALL destroys data itself; its case states what remains true (see
// flushAll). Every case also checks that every key in Valkey expires, and
// that the fault did what it is there for (the ambiguous calls of a black
// hole, the error replies of OOM, ...): a fault that tested nothing fails.
//
// Why the service and not the store: the defaults under test are the
// service's (its 15 ms store deadline, its batching charger, the store
// options it derives from the environment, REDIS_AUTH), the password case
// needs the service's own credentials, and FLUSHALL asks whether the service
// keeps answering. The store-level fault tests are in internal/store/valkey.

const (
	suiteWorkers = 64
	suitePrefix  = "fs:"
	// faultBound bounds a fault that lasts until it has had its effect
	// (a call sent and unanswered, a password refused): on this machine
	// valkey-go tears a silent connection down after about 2.5 s.
	faultBound = 8 * time.Second
)

// faultRun is one case's Valkey, proxy, service and load.
type faultRun struct {
	vk   *valkeytest.Server
	px   *valkeytest.Proxy // nil when the service talks to Valkey directly
	svc  *svc
	load *faultLoad
	// flushed and flushedLedger are the hits Valkey's counters and usage
	// ledger held when FLUSHALL deleted them, and flushedAt when it did
	// (FLUSHALL only).
	flushed, flushedLedger uint64
	flushedAt              time.Time
}

// faultCase is one fault: how to start Valkey and the service, how to
// inject and end the fault, and what the fault must have caused.
type faultCase struct {
	name   string
	proxy  bool
	valkey func(t *testing.T) []string // extra valkey-server arguments
	env    map[string]string
	resets bool // Valkey loses counters (the load's answers may restart)
	// after is how long the load runs once the fault has ended; default
	// half a second.
	after  time.Duration
	inject func(t *testing.T, r *faultRun)
	expect func(t *testing.T, r *faultRun, st suiteStats)
}

// TestFaultSuite runs every fault of the suite in turn (see above).
func TestFaultSuite(t *testing.T) {
	awayFromMidnight()
	cases := []faultCase{
		blackHole(true), blackHole(false), clientPause(), passwordRestart(),
		outOfMemory(), flushAll(), latency(), resets(), bandwidth(),
	}
	t0 := time.Now()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { runFault(t, c) })
	}
	t.Logf("fault suite: %v", time.Since(t0).Round(100*time.Millisecond))
}

// runFault runs one case: load, fault, load after it (c.after), then the
// accounting once the buffer has drained.
func runFault(t *testing.T, c faultCase) {
	var args []string
	if c.valkey != nil {
		args = c.valkey(t)
	}
	r := &faultRun{vk: valkeytest.Start(t, valkeytest.Options{Args: args})}
	addr := r.vk.Addr
	if c.proxy {
		r.px = valkeytest.StartProxy(t, r.vk.Addr)
		addr = r.px.Addr
	}
	dir := t.TempDir()
	writeFile(t, dir, "rl.yaml", budgetsYAML)
	r.svc = startSvc(t, svcOptions{ConfigDir: dir, Conns: 4, Env: merge(valkeyEnv(addr), map[string]string{"CACHE_KEY_PREFIX": suitePrefix}, c.env)})
	r.load = newFaultLoad(r.svc, "allow", "rl", "u", suiteWorkers)
	r.load.resets = c.resets
	r.load.start()
	defer r.load.stop()
	// Faults start under load that Valkey answers: every worker's counter
	// is there.
	if !waitUntil(10*time.Second, r.load.allCounted) {
		t.Fatalf("not every worker had an answer from Valkey within 10 s")
	}
	t0 := time.Now()
	c.inject(t, r)
	took := time.Since(t0)
	if c.after == 0 {
		c.after = 500 * time.Millisecond
	}
	time.Sleep(c.after) // stays: the load runs on through the fault for this long
	r.load.stop()
	r.load.checkNoWrong(t, c.name)
	st, total := settle(t, r.svc, r.vk.Addr)
	sent, abandoned := r.load.sent.Load(), r.load.abandoned.Load()
	t.Logf("%s: fault %v; charged %d hits (%d abandoned by the client), Valkey %d (flushed %d); %s",
		c.name, took.Round(10*time.Millisecond), sent, abandoned, total, r.flushed, st)
	checkExactlyOnce(t, st)
	// A call applied before a flush and replayed after it under its id,
	// whose bitmap the flush deleted, counts again.
	var again uint64
	if r.flushed > 0 {
		again = uint64(st.ambReplayed)
	}
	checkTotal(t, "counters", total, sent-r.flushed, abandoned+again)
	// Stopping the service flushes the ledger Recorder (the ledger hashes'
	// expiries); then every key must expire.
	if err := r.svc.stop(); err != nil {
		t.Errorf("service stop: %v", err)
	}
	ledger := sumLedger(t, r.vk.Addr)
	t.Logf("%s: usage ledger %d (flushed %d)", c.name, ledger, r.flushedLedger)
	checkTotal(t, "usage ledger", ledger, sent-r.flushedLedger, abandoned+again)
	checkExpiries(t, r.vk.Addr)
	if c.expect != nil {
		c.expect(t, r, st)
	}
}

// checkTotal: Valkey holds want hits, up to slack more.
func checkTotal(t *testing.T, what string, got, want, slack uint64) {
	t.Helper()
	if got < want || got > want+slack {
		t.Errorf("%s: Valkey holds %d hits, want %d (up to %d more)", what, got, want, slack)
	}
}

// ledgerKeys is the KEYS pattern of the usage ledger's hashes under prefix.
func ledgerKeys(prefix string) string { return prefix + "ledger:*:u" }

// sumLedger sums every field of the usage ledger's hashes.
func sumLedger(t *testing.T, addr string) uint64 {
	t.Helper()
	out, err := valkeytest.Do(addr, "KEYS", ledgerKeys(suitePrefix))
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	var sum uint64
	for _, k := range strings.Fields(out) {
		vals, err := valkeytest.Do(addr, "HVALS", k)
		if err != nil {
			t.Fatalf("HVALS %s: %v", k, err)
		}
		for _, v := range strings.Fields(vals) {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("ledger %s holds %q", k, v)
			}
			sum += n
		}
	}
	return sum
}

// allCounted reports whether every worker has had an answer from Valkey.
func (l *faultLoad) allCounted() bool {
	for i := range l.lastTotal {
		if l.lastTotal[i].Load() == 0 {
			return false
		}
	}
	return true
}

// suiteStats are the store's and the charger's classes as exported.
type suiteStats struct {
	storeStats
	unsent                              unsentStats
	ambApplied, ambReplayed, ambDropped float64
	stalled, notConnected               float64
	ledgerLost, ledgerExpired           float64
}

func readSuiteStats(text string) suiteStats {
	return suiteStats{
		storeStats:    readStoreStats(text),
		unsent:        readUnsentStats(text),
		ambApplied:    metric(text, "ratelimit_valkey_ambiguous_applied_hits_total"),
		ambReplayed:   metric(text, "ratelimit_valkey_ambiguous_replayed_hits_total"),
		ambDropped:    metric(text, "ratelimit_valkey_ambiguous_dropped_hits_total"),
		stalled:       metric(text, "ratelimit_valkey_stalled_calls_total"),
		notConnected:  metric(text, "ratelimit_valkey_not_connected_calls_total"),
		ledgerLost:    metric(text, "ratelimit_valkey_ledger_lost_tokens_total"),
		ledgerExpired: metric(text, "ratelimit_valkey_ledger_expired_tokens_total"),
	}
}

// waiting is the store tally's Waiting for counter hits: buffered or
// ambiguous, not yet resolved (lost includes the buffer's losses).
func (s suiteStats) waiting() float64 {
	return s.buffered - s.replayed - s.expired + s.ambiguous - s.ambApplied - s.ambReplayed - s.ambDropped
}

func (s suiteStats) String() string {
	return fmt.Sprintf("applied on error %v, buffered %v, replayed %v, ambiguous %v (found applied %v, replayed %v, dropped %v), lost %v, expired %v, canceled %v, deferred %v, no-slot calls %v (stalled %v)",
		s.appliedOnError, s.buffered, s.replayed, s.ambiguous, s.ambApplied, s.ambReplayed, s.ambDropped, s.lost, s.expired,
		s.unsent.canceled, s.unsent.deferred, s.noSlot, s.stalled)
}

// settle waits (bounded) until the store is settled: nothing waiting,
// nothing in the buffer or in flight, five polls in a row, and no metric
// changed while Valkey's counters were summed. It returns the stats and
// Valkey's total for the service's counters.
func settle(t *testing.T, s *svc, addr string) (suiteStats, uint64) {
	t.Helper()
	var (
		st     suiteStats
		total  uint64
		quiet  int
		summed bool
	)
	if !waitUntil(15*time.Second, func() bool {
		st = readSuiteStats(s.metrics())
		if st.bufferKeys != 0 || st.waiting() != 0 || st.inFlight != 0 {
			quiet = 0
			return false
		}
		if quiet++; quiet < 5 {
			return false
		}
		total, _ = sumKeys(t, addr, suitePrefix)
		summed = true
		if readSuiteStats(s.metrics()) != st {
			quiet = 0
			return false
		}
		return true
	}) {
		t.Errorf("not settled within 15 s: %d waiting, %v buffer entries, %v calls in flight; %s", int64(st.waiting()), st.bufferKeys, st.inFlight, st)
		if !summed {
			total, _ = sumKeys(t, addr, suitePrefix)
		}
	}
	return st, total
}

// checkExactlyOnce: nothing lost in any class, nothing waiting.
func checkExactlyOnce(t *testing.T, st suiteStats) {
	t.Helper()
	if st.lost != 0 || st.expired != 0 || st.ambDropped != 0 || st.ledgerLost != 0 || st.ledgerExpired != 0 {
		t.Errorf("lost %v (buffer lost included), expired %v, ambiguous dropped %v, ledger lost %v, ledger expired %v: want none",
			st.lost, st.expired, st.ambDropped, st.ledgerLost, st.ledgerExpired)
	}
	if st.buffered != st.replayed || st.ambiguous != st.ambApplied+st.ambReplayed {
		t.Errorf("buffered %v, replayed %v; ambiguous %v, found applied %v + replayed %v: something still waits", st.buffered, st.replayed, st.ambiguous, st.ambApplied, st.ambReplayed)
	}
	u := st.unsent
	if u.dropped != 0 || u.refused != 0 || u.saturated != 0 {
		t.Errorf("charger: dropped %v, refused %v, saturated %v: want none", u.dropped, u.refused, u.saturated)
	}
	if u.canceled > u.deferred || u.deferred > st.buffered {
		t.Errorf("canceled %v, deferred %v, buffered %v: hits handed back were not deferred, or deferred hits not buffered", u.canceled, u.deferred, st.buffered)
	}
}

// checkExpiries: every key in Valkey expires (the counters, the call id
// bitmaps: nothing the service writes stays forever), and each counter at
// its window's end plus the default 300 s grace.
func checkExpiries(t *testing.T, addr string) {
	t.Helper()
	out, err := valkeytest.Do(addr, "KEYS", "*")
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	for _, k := range strings.Split(out, "\n") {
		if k == "" {
			continue
		}
		v, err := valkeytest.Do(addr, "PEXPIRETIME", k)
		if err != nil {
			t.Fatalf("PEXPIRETIME %s: %v", k, err)
		}
		ms, _ := strconv.ParseInt(v, 10, 64)
		if ms < 0 {
			t.Errorf("key %q has no expiry (PEXPIRETIME %s)", k, v)
			continue
		}
		if want, ok := counterExpiry(k); ok && ms != want {
			t.Errorf("counter %q expires at %v, want its window's end + 300 s, %v", k, time.UnixMilli(ms).UTC(), time.UnixMilli(want).UTC())
		}
	}
}

// counterExpiry is the expiry in ms of a counter key of the service's safe
// format ("...|<unit seconds>|<window start, unix seconds>"): window end +
// the default grace of 300 s.
func counterExpiry(key string) (int64, bool) {
	if !strings.HasPrefix(key, suitePrefix+"bg1|") {
		return 0, false
	}
	f := strings.Split(key, "|")
	if len(f) < 3 {
		return 0, false
	}
	unit, err1 := strconv.ParseInt(f[len(f)-2], 10, 64)
	start, err2 := strconv.ParseInt(f[len(f)-1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return (start + unit + 300) * 1000, true
}

// untilMetric polls the service until cond holds of its stats, at most
// faultBound; false if it never did.
func untilMetric(r *faultRun, cond func(suiteStats) bool) bool {
	return waitUntil(faultBound, func() bool { return cond(readSuiteStats(r.svc.metrics())) })
}
