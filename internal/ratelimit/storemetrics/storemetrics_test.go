package storemetrics

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	valkeygo "github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/valkey"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// downClient is a real client that answers every command with an error
// while down is set (Valkey unreachable: nothing sent).
type downClient struct {
	valkeygo.Client
	down atomic.Bool
}

func (c *downClient) DoMulti(ctx context.Context, cmds ...valkeygo.Completed) []valkeygo.ValkeyResult {
	if !c.down.Load() {
		return c.Client.DoMulti(ctx, cmds...)
	}
	out := make([]valkeygo.ValkeyResult, len(cmds))
	for i := range out {
		out[i] = valkeygo.NewErrorResult(errors.New("valkey down"))
	}
	return out
}

// openStore is a Valkey store over a downClient of addr, down until the
// test says otherwise, replaying every 5 ms, with its metrics registered.
func openStore(t *testing.T, addr string, now func() time.Time, o valkey.Options) (*valkey.Store, *downClient, *prometheus.Registry) {
	t.Helper()
	vc, err := valkeygo.NewClient(valkeygo.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	dc := &downClient{Client: vc}
	dc.down.Store(true)
	o.Addresses, o.Now, o.ReplayInterval, o.StallAfter = []string{addr}, now, 5*time.Millisecond, -1
	s, err := valkey.NewWithClient(dc, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	reg := prometheus.NewRegistry()
	Register(reg, s)
	return s, dc, reg
}

// drained waits until s has nothing buffered or in flight.
func drained(t *testing.T, s *valkey.Store) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) { // poll the replayer
		if st := s.Stats(); st.BufferKeys == 0 && st.InFlight == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("buffer not drained: %+v", s.Stats())
		}
	}
}

// gather returns the value of every counter and gauge of reg, by name.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			out[mf.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

// releaseSeries are the release metrics and the tally classes each sums.
var releaseSeries = map[string][]store.Class{
	"ratelimit_valkey_buffered_releases_total":           {store.Buffered},
	"ratelimit_valkey_replayed_releases_total":           {store.Replayed},
	"ratelimit_valkey_lost_releases_total":               {store.Lost, store.BufferLost},
	"ratelimit_valkey_expired_releases_total":            {store.Expired},
	"ratelimit_valkey_ambiguous_releases_total":          {store.Ambiguous},
	"ratelimit_valkey_ambiguous_applied_releases_total":  {store.AmbiguousApplied},
	"ratelimit_valkey_ambiguous_replayed_releases_total": {store.AmbiguousReplayed},
	"ratelimit_valkey_ambiguous_dropped_releases_total":  {store.AmbiguousDropped},
	"ratelimit_valkey_canceled_releases_total":           {store.NotSent},
	"ratelimit_valkey_applied_on_error_releases_total":   {store.AppliedOnError},
}

// TestEveryReleaseClassHasASeries: every class the store tallies for hold
// releases but Applied has a series, as for hits and ledger increments
// (canceled and applied on error were tallied and not exported).
func TestEveryReleaseClassHasASeries(t *testing.T) {
	covered := map[store.Class]bool{store.Applied: true}
	for _, classes := range releaseSeries {
		for _, c := range classes {
			covered[c] = true
		}
	}
	for _, c := range store.Classes() {
		if !covered[c] {
			t.Errorf("release class %s has no series", c)
		}
	}
}

// TestReleaseClassesExported: what became of a reserving budget's hold
// releases is in the Valkey store's tally (store.TargetRelease) and now in
// ratelimit_valkey_*_releases_total, as the hits' and ledger increments'
// classes are: a release that waited in the outage buffer past its hold's
// certain expiry is dropped and counted expired (replayed, it would take
// another request's hold), one with no buffer to wait in is counted lost.
// Each series reads its tally classes.
func TestReleaseClassesExported(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	open := func(o valkey.Options) (*valkey.Store, *downClient, *prometheus.Registry) {
		return openStore(t, srv.Addr, now, o)
	}
	exp := now().Add(time.Hour)
	charge := []store.Counter{{Key: "k", Hits: 3, ExpireAt: exp, Hold: store.Hold{Release: 1, Expiry: 10 * time.Second, Window: exp.Unix()}}}

	stale, dc, staleReg := open(valkey.Options{})
	stale.Defer(charge)                // Valkey down: buffered
	clock.Add(int64(11 * time.Second)) // longer than a hold lives
	dc.down.Store(false)               // back: the replay drops the release, sends the hits
	drained(t, stale)
	lost, _, lostReg := open(valkey.Options{BufferMaxKeys: -1}) // no buffer
	lost.Defer(charge)

	for _, c := range []struct {
		name string
		s    *valkey.Store
		reg  *prometheus.Registry
		want map[string]float64
	}{
		{"stale", stale, staleReg, map[string]float64{"ratelimit_valkey_buffered_releases_total": 1, "ratelimit_valkey_expired_releases_total": 1, "ratelimit_valkey_replayed_hits_total": 3}},
		{"lost", lost, lostReg, map[string]float64{"ratelimit_valkey_lost_releases_total": 1, "ratelimit_valkey_lost_hits_total": 3}},
	} {
		got, y := gather(t, c.reg), c.s.Tally()
		for name, classes := range releaseSeries {
			var sum uint64
			for _, cl := range classes {
				sum += y.Get(store.TargetRelease, cl)
			}
			v, ok := got[name]
			if !ok || v != float64(sum) || v != c.want[name] {
				t.Errorf("%s: %s = %v (exported %t), tally %d, want %v", c.name, name, v, ok, sum, c.want[name])
			}
		}
		for name, want := range c.want {
			if got[name] != want {
				t.Errorf("%s: %s = %v, want %v", c.name, name, got[name], want)
			}
		}
	}
}

// help returns the help text of reg's metric name.
func help(t *testing.T, reg *prometheus.Registry, name string) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetHelp()
		}
	}
	t.Fatalf("%s not exported", name)
	return ""
}

// TestLedgerHelpSaysWhatHolds: the help of the ledger increments' series
// says what the store does. An unanswered one was "never re-sent"; it is
// kept with its charge under the call's id and replayed, landing once. A
// buffered one was said to be dropped when "their day ended"; it is dropped
// when the counter it was charged with expires (its window's end plus
// grace), whatever the ledger hash's retention.
func TestLedgerHelpSaysWhatHolds(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	s, dc, reg := openStore(t, srv.Addr, now, valkey.Options{})
	ledger := store.HashIncr{Key: "ledger:h", Field: "ambiguous"}
	err := s.Charge(context.Background(), []store.Counter{{Key: "c1", Hits: 4, ExpireAt: now().Add(time.Hour), Ledger: ledger}}, make([]store.Result, 1))
	if err == nil {
		t.Fatal("charge answered while Valkey is down")
	}
	dc.down.Store(false)
	drained(t, s)
	if got, _ := srv.Do("HGET", ledger.Key, ledger.Field); got != "4" || s.Stats().LedgerAmbiguous != 4 {
		t.Fatalf("ambiguous ledger increment: HGET = %s, stats %+v; want 4, replayed under its id", got, s.Stats())
	}
	if h := help(t, reg, "ratelimit_valkey_ledger_ambiguous_tokens_total"); strings.Contains(h, "never") || !strings.Contains(h, "replayed") {
		t.Errorf("ledger ambiguous help %q: they are replayed under their call's id", h)
	}

	dc.down.Store(true)
	late := store.HashIncr{Key: "ledger:h", Field: "expired"}
	s.Defer([]store.Counter{{Key: "c2", Hits: 2, ExpireAt: now().Add(time.Minute), Ledger: late}}) // its counter (an hour rule's, near its end) expires in a minute
	clock.Add(int64(2 * time.Minute))
	dc.down.Store(false)
	drained(t, s)
	if got, _ := srv.Do("HGET", late.Key, late.Field); got != "(nil)" || s.Stats().LedgerExpired != 2 {
		t.Fatalf("buffered ledger increment past its counter's expiry: HGET = %s, stats %+v; want dropped, 2 expired", got, s.Stats())
	}
	if h := help(t, reg, "ratelimit_valkey_ledger_expired_tokens_total"); strings.Contains(h, "day ended") || !strings.Contains(h, "counter") {
		t.Errorf("ledger expired help %q: they expire with the counter they were charged with, not with a day", h)
	}
}

// TestBufferBytesGauge: the outage buffer's bytes (what its entries count
// against VALKEY_BUFFER_MAX_BYTES) and its bound are exported next to its
// entries, so an operator sees the byte bound coming before charges are
// counted lost: a buffered 1,000-byte key counts its length plus the
// per-entry overhead, and nothing once replayed.
func TestBufferBytesGauge(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s, dc, reg := openStore(t, srv.Addr, time.Now, valkey.Options{BufferMaxBytes: 3 << 20})
	key := strings.Repeat("k", 1000)
	s.Defer([]store.Counter{{Key: key, Hits: 1, ExpireAt: time.Now().Add(time.Hour)}})
	got := gather(t, reg)
	if b := got["ratelimit_valkey_buffer_bytes"]; b < 1000 || b > 1000+512 || b != float64(s.Stats().BufferBytes) || got["ratelimit_valkey_buffer_keys"] != 1 {
		t.Errorf("one 1,000-byte key buffered: buffer_bytes %v (stats %d), buffer_keys %v", b, s.Stats().BufferBytes, got["ratelimit_valkey_buffer_keys"])
	}
	if m := got["ratelimit_valkey_buffer_max_bytes"]; m != 3<<20 {
		t.Errorf("buffer_max_bytes %v, want the store's bound %d", m, 3<<20)
	}
	dc.down.Store(false)
	drained(t, s)
	if b := gather(t, reg)["ratelimit_valkey_buffer_bytes"]; b != 0 {
		t.Errorf("buffer_bytes %v once replayed, want 0", b)
	}
}

// ledgerSeries are the ledger increments' metrics and the tally classes
// each sums: every class but Applied, as for hits.
var ledgerSeries = map[string][]store.Class{
	"ratelimit_valkey_ledger_canceled_tokens_total":           {store.NotSent},
	"ratelimit_valkey_ledger_applied_on_error_tokens_total":   {store.AppliedOnError},
	"ratelimit_valkey_ledger_buffered_tokens_total":           {store.Buffered},
	"ratelimit_valkey_ledger_replayed_tokens_total":           {store.Replayed},
	"ratelimit_valkey_ledger_lost_tokens_total":               {store.Lost, store.BufferLost},
	"ratelimit_valkey_ledger_expired_tokens_total":            {store.Expired},
	"ratelimit_valkey_ledger_ambiguous_tokens_total":          {store.Ambiguous},
	"ratelimit_valkey_ledger_ambiguous_applied_tokens_total":  {store.AmbiguousApplied},
	"ratelimit_valkey_ledger_ambiguous_replayed_tokens_total": {store.AmbiguousReplayed},
	"ratelimit_valkey_ledger_ambiguous_dropped_tokens_total":  {store.AmbiguousDropped},
}

// TestLedgerClassesExported: every class the Valkey store tallies for the
// ledger's increments (store.TargetLedger) but Applied is exported, as the
// hits' are: an ambiguous increment's resolution (found applied, replayed,
// given up), one handed back unsent (canceled) and one applied though its
// call failed were tallied and missing from /metrics. Each series reads its
// tally classes.
func TestLedgerClassesExported(t *testing.T) {
	covered := map[store.Class]bool{store.Applied: true}
	for _, classes := range ledgerSeries {
		for _, c := range classes {
			covered[c] = true
		}
	}
	for _, c := range store.Classes() {
		if !covered[c] {
			t.Errorf("ledger class %s has no series", c)
		}
	}
	srv := valkeytest.Start(t, valkeytest.Options{})
	s, dc, reg := openStore(t, srv.Addr, time.Now, valkey.Options{})
	exp := time.Now().Add(time.Hour)
	ledger := store.HashIncr{Key: "ledger:h", Field: "f"}
	if err := s.Charge(context.Background(), []store.Counter{{Key: "c1", Hits: 4, ExpireAt: exp, Ledger: ledger}}, make([]store.Result, 1)); err == nil {
		t.Fatal("charge answered while Valkey is down")
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	_ = s.Charge(gone, []store.Counter{{Key: "c2", Hits: 2, ExpireAt: exp, Ledger: ledger}}, make([]store.Result, 1))
	dc.down.Store(false)
	drained(t, s)
	got, y := gather(t, reg), s.Tally()
	want := map[string]float64{"ratelimit_valkey_ledger_ambiguous_tokens_total": 4,
		"ratelimit_valkey_ledger_ambiguous_replayed_tokens_total": 4, "ratelimit_valkey_ledger_canceled_tokens_total": 2}
	for name, classes := range ledgerSeries {
		var sum uint64
		for _, cl := range classes {
			sum += y.Get(store.TargetLedger, cl)
		}
		if v, ok := got[name]; !ok || v != float64(sum) || v != want[name] {
			t.Errorf("%s = %v (exported %t), tally %d, want %v", name, v, ok, sum, want[name])
		}
	}
}
