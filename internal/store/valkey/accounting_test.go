package valkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// faultyClient passes calls to a real Valkey but, while on, answers a share
// of them with a fault chosen at random: refused (nothing sent: a dial
// error), reply lost (sent and applied, the answer replaced by a timeout),
// short (sent and applied, one reply missing), or the script cache flushed
// first (as a restart or failover does: NOSCRIPT, then the EVAL retry, which
// may meet a fault of its own). PING always passes, so the replayer can
// tell when to replay.
type faultyClient struct {
	valkey.Client
	on      atomic.Bool
	mu      sync.Mutex
	rng     *rand.Rand
	faulted [5]atomic.Int64 // by fault
}

const (
	faultNone = iota
	faultRefused
	faultReplyLost
	faultShort
	faultScriptFlushed
)

func (f *faultyClient) pick() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rng.Intn(10) < 6 {
		return faultNone
	}
	return 1 + f.rng.Intn(4)
}

func (f *faultyClient) DoMulti(ctx context.Context, cmds ...valkey.Completed) []valkey.ValkeyResult {
	if !f.on.Load() || (len(cmds) == 1 && cmds[0].Commands()[0] == "PING") {
		return f.Client.DoMulti(ctx, cmds...)
	}
	fault := f.pick()
	f.faulted[fault].Add(1)
	switch fault {
	case faultRefused:
		return errResults(len(cmds), &setupError{err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}})
	case faultReplyLost:
		f.Client.DoMulti(context.Background(), cmds...)
		return errResults(len(cmds), context.DeadlineExceeded)
	case faultShort:
		res := f.Client.DoMulti(context.Background(), cmds...)
		return res[:len(res)-1]
	case faultScriptFlushed:
		f.Do(context.Background(), f.B().ScriptFlush().Build())
	}
	return f.Client.DoMulti(ctx, cmds...)
}

// TestAccountingProperty drives random calls (1-3 counters of a small key
// set, 0-5 hits each, some with a ledger increment, some of a reserving
// budget: a check holding tokens, or a charge releasing a hold; some
// deadlines so short the caller gives up) through random faults, then lets
// Valkey answer until the buffer is empty. For every seed: every hit and
// every release handed to the store ends in exactly one outcome class,
// nothing waits, nothing is lost, and Valkey holds each charged hit (and
// ledger increment) exactly once: applied + applied on error + replayed +
// ambiguous found applied + ambiguous replayed.
func TestAccountingProperty(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	seeds := 12
	if testing.Short() {
		seeds = 3
	}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			if _, err := srv.Do("FLUSHALL"); err != nil {
				t.Fatal(err)
			}
			accountingRun(t, srv, seed)
		})
	}
}

func accountingRun(t *testing.T, srv *valkeytest.Server, seed int64) {
	fc := &faultyClient{Client: realClient(t, srv.Addr), rng: rand.New(rand.NewSource(seed))}
	s := storeOver(t, fc, Options{Addresses: []string{srv.Addr}, ReplayInterval: 5 * time.Millisecond, StallAfter: -1})
	rng := rand.New(rand.NewSource(seed * 7919))
	exp := time.Now().Add(time.Hour)
	var charged, ledgerCharged, released uint64
	hold := store.Hold{Expiry: time.Hour, Window: exp.Unix()}
	fc.on.Store(true)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		calls := make([][]store.Counter, 60)
		for i := range calls {
			n := 1 + rng.Intn(3)
			for j := 0; j < n; j++ {
				k := store.Counter{Key: "acct:k" + strconv.Itoa(rng.Intn(20)), Hits: uint64(rng.Intn(6)), ExpireAt: exp}
				if k.Hits > 0 && rng.Intn(3) == 0 {
					k.Ledger = store.HashIncr{Key: "acct:ledger", Field: k.Key}
					ledgerCharged += k.Hits
				}
				if rng.Intn(3) == 0 { // a reserving budget's counter
					k.Hold, k.Limit, k.Enforce = hold, 1<<40, true
					if k.Hits == 0 {
						k.Hold.Reserve = 1 + uint64(rng.Intn(5))
					} else {
						k.Hold.Release = 1
						released++
					}
				}
				charged += k.Hits
				calls[i] = append(calls[i], k)
			}
		}
		deadlines := make([]time.Duration, len(calls))
		for i := range deadlines {
			deadlines[i] = time.Second
			if rng.Intn(8) == 0 {
				deadlines[i] = time.Duration(rng.Intn(300)) * time.Microsecond
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, cs := range calls {
				ctx, cancel := context.WithTimeout(context.Background(), deadlines[i])
				err := s.Charge(ctx, cs, make([]store.Result, len(cs)))
				cancel()
				if err != nil && errors.Is(err, store.ErrNotSent) {
					s.Defer(cs) // what the charger does with a call that never started
				}
			}
		}()
	}
	wg.Wait()
	fc.on.Store(false)
	waitDrained(t, s, 10*time.Second)
	waitUntil(t, 5*time.Second, func() bool { return s.Stats().InFlight == 0 })
	checkTally(t, s, srv, charged, ledgerCharged)
	checkReleases(t, s, released)
	t.Logf("faults: none %d, refused %d, reply lost %d, short %d, script flushed %d; stats %+v", fc.faulted[0].Load(), fc.faulted[1].Load(), fc.faulted[2].Load(), fc.faulted[3].Load(), fc.faulted[4].Load(), s.Stats())
}

// checkTally asserts the property on the tally and on Valkey.
func checkTally(t *testing.T, s *Store, srv *valkeytest.Server, charged, ledgerCharged uint64) {
	t.Helper()
	y := s.Tally()
	c, l := store.TargetCounter, store.TargetLedger
	// Hits handed back (NotSent) come back through Defer: handed twice.
	if got := y.Handed(c) - y.Get(c, store.NotSent); got != charged {
		t.Errorf("counter hits handed to the store %d (outcomes: %s), want %d charged", got, classes(y, c), charged)
	}
	if w := y.Waiting(c); w != 0 {
		t.Errorf("%d counter hits still waiting: %s", w, classes(y, c))
	}
	for _, cl := range []store.Class{store.Lost, store.BufferLost, store.AmbiguousDropped, store.Expired} {
		if n := y.Get(c, cl); n != 0 {
			t.Errorf("%d counter hits %s: %s", n, cl, classes(y, c))
		}
	}
	want := y.Get(c, store.Applied) + y.Get(c, store.AppliedOnError) + y.Get(c, store.Replayed) +
		y.Get(c, store.AmbiguousApplied) + y.Get(c, store.AmbiguousReplayed)
	if got := counterSum(t, srv, "acct:k*"); got != want || got != charged {
		t.Errorf("valkey holds %d hits, the tally says %d, %d were charged: counted twice or lost (%s)", got, want, charged, classes(y, c))
	}
	if got := y.Handed(l) - y.Get(l, store.NotSent); got != ledgerCharged || y.Waiting(l) != 0 {
		t.Errorf("ledger: handed %d of %d, waiting %d (%s)", got, ledgerCharged, y.Waiting(l), classes(y, l))
	}
	// The ledger's increments ride in the same scripts: exactly once too.
	lwant := y.Get(l, store.Applied) + y.Get(l, store.Replayed) + y.Get(l, store.AmbiguousApplied) + y.Get(l, store.AmbiguousReplayed)
	if got := hashSum(t, srv, "acct:ledger"); got != lwant || got != ledgerCharged {
		t.Errorf("ledger in valkey %d, the tally says %d, %d were charged (%s)", got, lwant, ledgerCharged, classes(y, l))
	}
}

// checkReleases asserts that every hold release handed to the store ended in
// exactly one class and none was lost, dropped or expired.
func checkReleases(t *testing.T, s *Store, released uint64) {
	t.Helper()
	y, r := s.Tally(), store.TargetRelease
	if got := y.Handed(r) - y.Get(r, store.NotSent); got != released || y.Waiting(r) != 0 {
		t.Errorf("releases: handed %d of %d, waiting %d (%s)", got, released, y.Waiting(r), classes(y, r))
	}
	for _, cl := range []store.Class{store.Lost, store.BufferLost, store.AmbiguousDropped, store.Expired} {
		if n := y.Get(r, cl); n != 0 {
			t.Errorf("%d releases %s: %s", n, cl, classes(y, r))
		}
	}
}

func classes(y *store.Tally, t store.Target) string {
	var b strings.Builder
	for _, c := range store.Classes() {
		if n := y.Get(t, c); n != 0 {
			fmt.Fprintf(&b, "%s=%d ", c, n)
		}
	}
	return b.String()
}

func counterSum(t *testing.T, srv *valkeytest.Server, pattern string) uint64 {
	t.Helper()
	out, err := srv.Do("KEYS", pattern)
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, k := range strings.Fields(out) {
		v, err := srv.Do("GET", k)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		sum += n
	}
	return sum
}

func hashSum(t *testing.T, srv *valkeytest.Server, key string) uint64 {
	t.Helper()
	out, err := srv.Do("HVALS", key)
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, v := range strings.Fields(out) {
		n, _ := strconv.ParseUint(v, 10, 64)
		sum += n
	}
	return sum
}
