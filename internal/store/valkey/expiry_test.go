package valkey

import (
	"context"
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

func calls(t *testing.T, addr, cmd string) int {
	t.Helper()
	return int(commandStat(t, addr, cmd, "calls"))
}

// commandStat is one field (calls, usec, ...) of a command's line in
// Valkey's INFO commandstats; 0 before the command's first call.
func commandStat(tb testing.TB, addr, cmd, field string) int64 {
	tb.Helper()
	out, err := valkeytest.Do(addr, "INFO", "commandstats")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, field+"="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					tb.Fatalf("INFO commandstats %s: %v", line, err)
				}
				return n
			}
		}
	}
	return 0
}

// TestExpirySetOncePerCounter: the charge script sets a counter's absolute
// expiry in the call that creates it (the add returned exactly its hits),
// and never again: later charges of the counter cost INCRBY alone inside
// the script; a counter lost by the server (restart without persistence,
// failover) gets its expiry again when a charge recreates it.
func TestExpirySetOncePerCounter(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	// The store's clock stands still, early in an id epoch: a call re-sends
	// the id bitmap's expiry a second after it was last confirmed, and in
	// an epoch's last second (ids.go), which this test must not count.
	t0 := time.Now().Truncate(time.Minute).Add(5 * time.Second)
	s := mustNew(t, Options{Addresses: []string{srv.Addr}, Now: func() time.Time { return t0 }})
	exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	charge := func(hits uint64, keys ...string) []store.Result {
		t.Helper()
		cs := make([]store.Counter, len(keys))
		for i, k := range keys {
			cs[i] = store.Counter{Key: k, Hits: hits, ExpireAt: exp}
		}
		totals := make([]store.Result, len(keys))
		if err := s.Charge(context.Background(), cs, totals); err != nil {
			t.Fatal(err)
		}
		return totals
	}
	wantExpiry := func(k string) {
		t.Helper()
		if out, _ := srv.Do("PEXPIRETIME", k); out != strconv.FormatInt(exp.UnixMilli(), 10) {
			t.Fatalf("PEXPIRETIME %s = %s, want %d", k, out, exp.UnixMilli())
		}
	}
	p0 := calls(t, srv.Addr, "pexpireat")
	charge(3, "a", "b")
	wantExpiry("a")
	wantExpiry("b")
	// Two counters created, plus the call id's bitmap (created too).
	if p := calls(t, srv.Addr, "pexpireat") - p0; p != 3 {
		t.Fatalf("first charges of 2 counters sent %d PEXPIREAT, want 3 (2 counters and the id bitmap)", p)
	}
	p0, i0 := calls(t, srv.Addr, "pexpireat"), calls(t, srv.Addr, "incrby")
	for i := 0; i < 20; i++ {
		charge(5, "a", "b")
	}
	if p, i := calls(t, srv.Addr, "pexpireat")-p0, calls(t, srv.Addr, "incrby")-i0; p != 0 || i != 40 {
		t.Fatalf("20 charges of 2 existing counters sent %d PEXPIREAT and %d INCRBY, want 0 and 40", p, i)
	}
	// Concurrent first charges: exactly one creates the counter and sets
	// its expiry; the counter is exact.
	p1 := calls(t, srv.Addr, "pexpireat")
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Charge(context.Background(), []store.Counter{{Key: "c", Hits: 2, ExpireAt: exp}}, make([]store.Result, 1)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got, _ := srv.Do("GET", "c"); got != "40" {
		t.Fatalf("c = %s, want 40", got)
	}
	if p := calls(t, srv.Addr, "pexpireat") - p1; p != 1 {
		t.Fatalf("20 concurrent first charges sent %d PEXPIREAT, want 1", p)
	}
	wantExpiry("c")
	// The server loses a counter: the next charge recreates it with its
	// expiry, in the same round trip.
	if _, err := srv.Do("DEL", "a"); err != nil {
		t.Fatal(err)
	}
	if got := charge(7, "a", "b"); got[0].Total != 7 || got[1].Total != 3+20*5+7 {
		t.Fatalf("totals %v", got)
	}
	wantExpiry("a")
}

// realClient is a standalone valkey-go client to addr, for wrapping in a
// fault-injecting Client; the store made over it closes it.
func realClient(t *testing.T, addr string) valkey.Client {
	t.Helper()
	vc, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	return vc
}

// storeOver is a store over c (a test logger unless opts has one), closed
// when the test ends.
func storeOver(t *testing.T, c Client, opts Options) *Store {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger, _ = testLogger(t)
	}
	s, err := NewWithClient(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestIDBitmapExpiryAfterFlush: the call id bitmap gets its expiry again
// when Valkey loses it while the store believes it set (FLUSHALL here; a
// restart without persistence, a failover or an eviction do the same): the
// next SETBIT recreates the bitmap, and a bitmap without expiry would stay
// in Valkey for good (found by the FLUSHALL case of the service's fault
// suite, test/reliability). Within a second of the store's clock, one call
// carries the expiry again.
func TestIDBitmapExpiryAfterFlush(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	var clock atomic.Int64
	start := time.Now().Truncate(time.Minute).Add(5 * time.Second) // early in an id epoch
	clock.Store(start.UnixNano())
	s := mustNew(t, Options{Addresses: []string{srv.Addr}, Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	charge := func() {
		t.Helper()
		cs := []store.Counter{{Key: "bm", Hits: 1, ExpireAt: time.Now().Add(time.Hour)}}
		if err := s.Charge(context.Background(), cs, make([]store.Result, 1)); err != nil {
			t.Fatal(err)
		}
	}
	bitmapExpiry := func() string {
		t.Helper()
		keys, err := srv.Do("KEYS", "bgid|*")
		if err != nil || keys == "" || strings.Contains(keys, "\n") {
			t.Fatalf("KEYS bgid|*: %q, %v; want one bitmap", keys, err)
		}
		out, err := srv.Do("PEXPIRETIME", keys)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	charge()
	charge()
	if e := bitmapExpiry(); e == "-1" {
		t.Fatal("the bitmap has no expiry after its first calls")
	}
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	charge() // recreates the bitmap; the store still believes its expiry set
	clock.Add(int64(1500 * time.Millisecond))
	charge()
	if e := bitmapExpiry(); e == "-1" {
		t.Fatal("after FLUSHALL the recreated id bitmap never gets an expiry: it would stay in Valkey for good")
	}
	// In an epoch's last second no later call of the epoch may come to
	// re-send the expiry: every call carries it.
	clock.Store(start.Add(54500 * time.Millisecond).UnixNano()) // half a second before the epoch ends
	charge()
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	charge()
	if e := bitmapExpiry(); e == "-1" {
		t.Fatal("a bitmap recreated in its epoch's last second has no expiry, and no call of its epoch is left to set it")
	}
}
