package valkey

import (
	"context"
	"errors"
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

func calls(t *testing.T, addr, cmd string) int {
	t.Helper()
	out, err := valkeytest.Do(addr, "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, _, _ := strings.Cut(rest, ",")
			v, _ := strconv.Atoi(n)
			return v
		}
	}
	return 0
}

// TestExpiryKnownAfterFirstCharge: the first charge of a counter sends
// INCRBY + PEXPIREAT NX in one round trip; later charges send INCRBY only; a
// counter lost by the server (and so recreated) gets its expiry again.
func TestExpiryKnownAfterFirstCharge(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}})
	exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	charge := func(hits uint64, keys ...string) []uint64 {
		t.Helper()
		cs := make([]store.Counter, len(keys))
		for i, k := range keys {
			cs[i] = store.Counter{Key: k, Hits: hits, ExpireAt: exp}
		}
		totals := make([]uint64, len(keys))
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
	if p := calls(t, srv.Addr, "pexpireat") - p0; p != 2 {
		t.Fatalf("first charges of 2 counters sent %d PEXPIREAT, want 2", p)
	}
	p0, i0 := calls(t, srv.Addr, "pexpireat"), calls(t, srv.Addr, "incrby")
	for i := 0; i < 20; i++ {
		charge(5, "a", "b")
	}
	if p, i := calls(t, srv.Addr, "pexpireat")-p0, calls(t, srv.Addr, "incrby")-i0; p != 0 || i != 40 {
		t.Fatalf("20 charges of 2 existing counters sent %d PEXPIREAT and %d INCRBY, want 0 and 40", p, i)
	}
	// Concurrent first charges: each may send PEXPIREAT NX (the first wins),
	// the counter is exact and has its expiry.
	p1 := calls(t, srv.Addr, "pexpireat")
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Charge(context.Background(), []store.Counter{{Key: "c", Hits: 2, ExpireAt: exp}}, make([]uint64, 1)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got, _ := srv.Do("GET", "c"); got != "40" {
		t.Fatalf("c = %s, want 40", got)
	}
	if p := calls(t, srv.Addr, "pexpireat") - p1; p < 1 || p > 20 {
		t.Fatalf("20 concurrent first charges sent %d PEXPIREAT, want 1-20", p)
	}
	wantExpiry("c")
	// The server loses a counter (restart without persistence, failover):
	// the next charge recreates it and sets its expiry again, in a second
	// round trip.
	if _, err := srv.Do("DEL", "a"); err != nil {
		t.Fatal(err)
	}
	p2 := calls(t, srv.Addr, "pexpireat")
	if got := charge(7, "a", "b"); got[0] != 7 || got[1] != 3+20*5+7 {
		t.Fatalf("totals %v", got)
	}
	wantExpiry("a")
	if p := calls(t, srv.Addr, "pexpireat") - p2; p != 1 {
		t.Fatalf("recreating one counter sent %d PEXPIREAT, want 1", p)
	}
}

// TestExpiryCacheBounded: past its bound the cache forgets (ended windows
// first), and a forgotten counter just gets PEXPIREAT NX again.
func TestExpiryCacheBounded(t *testing.T) {
	c := newExpiryCache(32) // 2 per shard
	for i := 0; i < 1000; i++ {
		c.add("k"+strconv.Itoa(i), 2000, 1000)
	}
	if n := c.len(); n > 32 {
		t.Fatalf("%d entries, bound 32", n)
	}
	c.add("old", 500, 1000) // already ended
	if !c.has("old", 500) || c.has("old", 600) {
		t.Fatal("has must match key and expiry")
	}
	var nilCache *expiryCache
	nilCache.add("x", 1, 0)
	if nilCache.has("x", 1) {
		t.Fatal("a disabled cache knows nothing")
	}
	// Disabled in the store: every charge sends PEXPIREAT NX.
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}, KnownExpiries: -1})
	p0 := calls(t, srv.Addr, "pexpireat")
	for i := 0; i < 3; i++ {
		if err := s.Charge(context.Background(), []store.Counter{{Key: "d", Hits: 1, ExpireAt: time.Now().Add(time.Hour)}}, make([]uint64, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if p := calls(t, srv.Addr, "pexpireat") - p0; p != 3 {
		t.Fatalf("%d PEXPIREAT with the cache off, want 3", p)
	}
}

// failingExpiry passes commands to a real client but, while fail is set,
// does not send PEXPIREAT commands and answers them with a connection error.
type failingExpiry struct {
	valkey.Client
	fail atomic.Bool
}

func (f *failingExpiry) DoMulti(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult {
	if !f.fail.Load() {
		return f.Client.DoMulti(ctx, multi...)
	}
	var keep []valkey.Completed
	var idx []int
	for i := range multi {
		if cmd := multi[i].Commands(); len(cmd) == 0 || cmd[0] != "PEXPIREAT" {
			keep, idx = append(keep, multi[i]), append(idx, i)
		}
	}
	out := errResults(len(multi), &setupError{err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}})
	if len(keep) > 0 {
		for n, r := range f.Client.DoMulti(ctx, keep...) {
			out[idx[n]] = r
		}
	}
	return out
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

func TestExpiryFailureIsBufferedAndReported(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	fc := &failingExpiry{Client: realClient(t, srv.Addr)}
	fc.fail.Store(true)
	s := storeOver(t, fc, Options{Addresses: []string{srv.Addr}, ReplayInterval: 20 * time.Millisecond})
	exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	err := s.Charge(context.Background(), []store.Counter{{Key: "k", Hits: 4, ExpireAt: exp}}, make([]uint64, 1))
	if err == nil || !strings.Contains(err.Error(), "set expiry of counter 0") {
		t.Fatalf("err = %v, want the expiry failure reported", err)
	}
	if got, _ := srv.Do("GET", "k"); got != "4" {
		t.Fatalf("k = %s, want 4 (the INCRBY was applied)", got)
	}
	if st := s.Stats(); st.BufferKeys != 1 || st.Buffered != 0 || st.Lost != 0 {
		t.Fatalf("stats %+v: want the expiry, and no hits, in the buffer", st)
	}
	fc.fail.Store(false)
	waitDrained(t, s, 3*time.Second)
	if out, _ := srv.Do("PEXPIRETIME", "k"); out != strconv.FormatInt(exp.UnixMilli(), 10) {
		t.Fatalf("PEXPIRETIME k = %s after the replay, want %d", out, exp.UnixMilli())
	}
	if got, _ := srv.Do("GET", "k"); got != "4" {
		t.Fatalf("k = %s after the replay, want 4 (counted once)", got)
	}
	// The same for the second round trip of a counter Valkey lost.
	if _, err := srv.Do("DEL", "k"); err != nil {
		t.Fatal(err)
	}
	fc.fail.Store(true)
	err = s.Charge(context.Background(), []store.Counter{{Key: "k", Hits: 2, ExpireAt: exp}}, make([]uint64, 1))
	if err == nil || !strings.Contains(err.Error(), "set expiry of counter 0") {
		t.Fatalf("recreated counter: err = %v, want the expiry failure reported", err)
	}
	if out, _ := srv.Do("PEXPIRETIME", "k"); out != "-1" {
		t.Fatalf("PEXPIRETIME k = %s before the replay, want -1 (no expiry yet)", out)
	}
	fc.fail.Store(false)
	waitDrained(t, s, 3*time.Second)
	if out, _ := srv.Do("PEXPIRETIME", "k"); out != strconv.FormatInt(exp.UnixMilli(), 10) {
		t.Fatalf("PEXPIRETIME k = %s after the replay, want %d", out, exp.UnixMilli())
	}
}
