package engine

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/budgetgen/budgetgen/internal/ratelimit/charge"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/observe"
	"github.com/budgetgen/budgetgen/internal/ratelimit/storemetrics"
	"github.com/budgetgen/budgetgen/internal/store"
	valkeystore "github.com/budgetgen/budgetgen/internal/store/valkey"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// accountingEngine is the accounting tests' world: a Valkey store (opts,
// replaying every 20 ms), its metrics and the engine's in one registry, and
// an engine (eopts) over the store, wrapped by wrap when not nil, with no
// over-limit cache (every call reaches the store) and one descriptor whose
// cap never binds. Both are closed at cleanup, the engine first.
func accountingEngine(t *testing.T, opts valkeystore.Options, wrap func(*valkeystore.Store) store.Store, eopts Options) (*valkeystore.Store, *Engine, *metrics.Metrics, *prometheus.Registry) {
	t.Helper()
	opts.ReplayInterval = 20 * time.Millisecond
	vs, err := valkeystore.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vs.Close() })
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	storemetrics.Register(reg, vs)
	eopts.Store, eopts.OverLimitCacheSize = store.Store(vs), -1
	eopts.Observers = append(eopts.Observers, observe.NewMetrics(m))
	if wrap != nil {
		eopts.Store = wrap(vs)
	}
	e, err := New(eopts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	e.SetConfig(mustConfig(t, `domain: d
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000000000}
`))
	return vs, e, m, reg
}

// slowProxy forwards TCP to a backend, holding every chunk sent towards
// it for delay: a slow link, where calls miss their deadline and queue up
// but nothing is torn down.
func slowProxy(t *testing.T, backend string, delay *atomic.Int64) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", backend)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, b)
			mu.Unlock()
			wg.Add(2)
			go func() { // towards Valkey, delayed
				defer wg.Done()
				defer b.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						time.Sleep(time.Duration(delay.Load())) // stays: the injected network delay
						if _, werr := b.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, b)
			}()
		}
	}()
	return ln.Addr().String()
}

// TestExactAccountingBehindSlowLink: with Valkey behind a slow link, many
// calls miss their 15 ms deadline (many wait for one of 4 slots past it,
// so they are never sent and go to the outage buffer).
// Once the link is fast again and the outage buffer has drained, every hit
// charged is either in Valkey or in exactly one reported class: charged =
// stored + lost + expired + unsent (dropped, refused,
// saturated), with ambiguous hits (sent, unanswered) the only slack.
func TestExactAccountingBehindSlowLink(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	var delay atomic.Int64
	proxy := slowProxy(t, srv.Addr, &delay)
	vs, e, m, reg := accountingEngine(t, valkeystore.Options{Addresses: []string{proxy}, MaxInFlight: 4}, nil, Options{})
	// Warm the connections, then slow the link.
	if _, err := e.ShouldRateLimit(context.Background(), req("d", 0, withHits(d("user", "warm"), 0))); err != nil {
		t.Fatal(err)
	}
	delay.Store(int64(40 * time.Millisecond))
	var attempted atomic.Uint64
	var failed atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 60; i++ {
				h := uint64(1 + (g+i)%5)
				attempted.Add(h)
				dd := d("user", fmt.Sprint("p", (g*7+i)%40))
				dd.HitsAddend = wrapperspb.UInt64(h)
				if _, err := e.ShouldRateLimit(context.Background(), req("d", 0, dd)); err != nil {
					t.Error(err)
					return
				}
				if testutil.ToFloat64(m.StoreErrors.WithLabelValues("charge", "timeout"))+testutil.ToFloat64(m.StoreErrors.WithLabelValues("charge", "unavailable")) > 0 {
					failed.Add(1)
				}
			}
		}(g)
	}
	wg.Wait()
	delay.Store(0)
	// Drain: nothing in flight, nothing buffered, for a while.
	quiet := 0
	for end := time.Now().Add(20 * time.Second); quiet < 10; time.Sleep(20 * time.Millisecond) {
		st := vs.Stats()
		if st.InFlight == 0 && st.BufferKeys == 0 {
			quiet++
		} else {
			quiet = 0
		}
		if time.Now().After(end) {
			t.Fatalf("store did not drain: %+v", st)
		}
	}
	var stored uint64
	for p := 0; p < 40; p++ {
		k := string(e.planner.Keys.Append(nil, "d", d("user", fmt.Sprint("p", p)).Entries, nil, 86400, time.Now().Unix()/86400*86400))
		v, err := srv.Do("GET", k)
		if err != nil {
			t.Fatal(err)
		}
		if v != "(nil)" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("%s = %q", k, v)
			}
			stored += n
		}
	}
	// Read from the exported metrics, as a monitoring system would.
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	metric := func(name string, labels ...string) uint64 {
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
			for _, mt := range f.GetMetric() {
				ok := true
				for i := 0; i+1 < len(labels); i += 2 {
					found := false
					for _, lp := range mt.GetLabel() {
						found = found || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
					}
					ok = ok && found
				}
				if ok {
					return uint64(mt.GetCounter().GetValue())
				}
			}
		}
		return 0
	}
	unsent := func(c string) uint64 { return metric("ratelimit_unsent_hits_total", "outcome", c) }
	lost, expired, canceled := metric("ratelimit_valkey_lost_hits_total"), metric("ratelimit_valkey_expired_hits_total"), metric("ratelimit_valkey_canceled_hits_total")
	ambiguous, buffered, replayed := metric("ratelimit_valkey_ambiguous_hits_total"), metric("ratelimit_valkey_buffered_hits_total"), metric("ratelimit_valkey_replayed_hits_total")
	// Canceled hits (the deadline passed as the store was called) are handed
	// back with store.ErrNotSent and deferred: they are in deferred and
	// buffered too, so they are not a class of their own here.
	reported := lost + expired + unsent(charge.UnsentDropped) + unsent(charge.UnsentRefused) + unsent(charge.UnsentSaturated)
	t.Logf("attempted %d, stored %d, reported %d (lost %d expired %d canceled %d), ambiguous %d, buffered %d replayed %d, applied on error %d, deferred %d",
		attempted.Load(), stored, reported, lost, expired, canceled, ambiguous, buffered, replayed, metric("ratelimit_valkey_applied_on_error_hits_total"), unsent(charge.UnsentDeferred))
	if st := vs.Stats(); st.Buffered != buffered || st.Lost != lost || st.Canceled != canceled {
		t.Fatalf("exported metrics disagree with the store's stats %+v", st)
	}
	if failed.Load() == 0 || buffered == 0 || replayed == 0 {
		t.Fatalf("no call missed its deadline or was buffered (failed %d, buffered %d, replayed %d): the link was not slow enough to test anything", failed.Load(), buffered, replayed)
	}
	if got := stored + reported; got > attempted.Load() || got+ambiguous < attempted.Load() {
		t.Fatalf("stored %d + reported %d = %d, ambiguous %d; attempted %d: hits lost without a class or counted twice",
			stored, reported, got, ambiguous, attempted.Load())
	}
}

// lateValkey hands every second call to the Valkey store only once its
// deadline has passed: the deadline passing between the charger's check
// and the store's own one, as when the flusher is preempted on a loaded
// machine, made deterministic.
type lateValkey struct {
	*valkeystore.Store
	n atomic.Int64
}

func (l *lateValkey) Charge(ctx context.Context, cs []store.Counter, totals []store.Result) error {
	if l.n.Add(1)%2 == 0 {
		<-ctx.Done()
	}
	return l.Store.Charge(ctx, cs, totals)
}

// TestDeadlineInsideStoreCallIsBuffered: hits of calls whose deadline
// passed as the Valkey store was called (it sends nothing and answers
// store.ErrNotSent) reach Valkey through the outage buffer, exactly once,
// and the exported metrics say so: canceled = deferred = buffered =
// replayed, Valkey = charged. Before, the store dropped them and counted
// them only as canceled, which the reliability tests did not read: the
// stall test's "Valkey total below sent - ambiguous" under load.
func TestDeadlineInsideStoreCallIsBuffered(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	vs, e, m, _ := accountingEngine(t, valkeystore.Options{Addresses: []string{srv.Addr}},
		func(vs *valkeystore.Store) store.Store { return &lateValkey{Store: vs} }, Options{StoreTimeout: 5 * time.Millisecond})
	var charged atomic.Uint64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				h := uint64(1 + (g+i)%3)
				dd := d("user", fmt.Sprint("p", g))
				dd.HitsAddend = wrapperspb.UInt64(h)
				if _, err := e.ShouldRateLimit(context.Background(), req("d", 0, dd)); err != nil {
					t.Error(err)
					return
				}
				charged.Add(h)
			}
		}(g)
	}
	wg.Wait()
	e.Flush()
	// A call answered by the failure policy can still be inside the store,
	// and its hits are deferred only when that call returns: wait until no
	// store call is in flight, the buffer is drained, and nothing changed
	// over several polls (a CI run beside a CPU hog read the totals between
	// the last deferral and its replay).
	var last valkeystore.Stats
	quiet := 0
	if !waitFor(10*time.Second, func() bool {
		st := vs.Stats()
		if st.InFlight == 0 && st.BufferKeys == 0 && st.Replayed == st.Buffered && st == last {
			quiet++
		} else {
			quiet = 0
		}
		last = st
		return quiet >= 5
	}) {
		t.Fatalf("buffer not drained: %+v", vs.Stats())
	}
	var stored uint64
	for g := 0; g < 8; g++ {
		k := string(e.planner.Keys.Append(nil, "d", d("user", fmt.Sprint("p", g)).Entries, nil, 86400, time.Now().Unix()/86400*86400))
		v, err := srv.Do("GET", k)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s = %q", k, v)
		}
		stored += n
	}
	st := vs.Stats()
	deferred := testutil.ToFloat64(m.UnsentHits.WithLabelValues(charge.UnsentDeferred))
	t.Logf("charged %d, stored %d; canceled %d, deferred %v, buffered %d, replayed %d, ambiguous %d, lost %d",
		charged.Load(), stored, st.Canceled, deferred, st.Buffered, st.Replayed, st.Ambiguous, st.Lost)
	if st.Canceled == 0 {
		t.Fatal("no call reached the store past its deadline: nothing tested")
	}
	if float64(st.Canceled) != deferred || st.Buffered < st.Canceled || st.Lost != 0 || st.Ambiguous != 0 {
		t.Fatalf("canceled %d, deferred %v, buffered %d, lost %d, ambiguous %d: want canceled = deferred <= buffered, nothing lost or ambiguous",
			st.Canceled, deferred, st.Buffered, st.Lost, st.Ambiguous)
	}
	if stored != charged.Load() {
		t.Fatalf("Valkey holds %d of %d hits charged: hits of calls late into the store were lost", stored, charged.Load())
	}
}

func waitFor(timeout time.Duration, cond func() bool) bool {
	for end := time.Now().Add(timeout); ; time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}
