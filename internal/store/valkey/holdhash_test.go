package valkey

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// TestHoldHashKeepsOnlyLiveHolds: a window's holds live in one hash (one
// field per counter) that keeps only counters with holds: a released hold
// deletes its field, and the hash takes the latest expiry of its counters
// (a replica with a longer grace extends it, never shortens it).
func TestHoldHashKeepsOnlyLiveHolds(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}, KeyPrefix: "p:"})
	window := time.Now().Add(time.Hour).Unix()
	hash := "p:bgh|" + strconv.FormatInt(window, 10)
	do := func(args ...string) string {
		t.Helper()
		out, err := valkeytest.Do(srv.Addr, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return out
	}
	send := func(grace time.Duration, cs ...store.Counter) []store.Result {
		t.Helper()
		for i := range cs {
			cs[i].ExpireAt, cs[i].Hold.Window, cs[i].Hold.Expiry = time.Unix(window, 0).Add(grace), window, time.Hour
			cs[i].Start, cs[i].Limit, cs[i].Enforce = true, 1000, true
		}
		rs := make([]store.Result, len(cs))
		if err := s.Charge(context.Background(), cs, rs); err != nil {
			t.Fatal(err)
		}
		return rs
	}
	check := func(key string) store.Counter { return store.Counter{Key: key, Hold: store.Hold{Reserve: 100}} }
	settle := func(key string) store.Counter { return store.Counter{Key: key, Hits: 80, Hold: store.Hold{Release: 1}} }

	rs := send(time.Minute, check("a"), check("b"), check("b"))
	if !rs[0].Held || !rs[1].Held || !rs[2].Held {
		t.Fatalf("checks: %+v, want all held", rs)
	}
	if got := do("HLEN", hash); got != "2" {
		t.Fatalf("HLEN %s = %s after holds on two counters, want 2", hash, got)
	}
	wantExpiry := func(grace time.Duration) {
		t.Helper()
		want := time.Unix(window, 0).Add(grace).UnixMilli()
		if got := do("PEXPIRETIME", hash); got != strconv.FormatInt(want, 10) {
			t.Fatalf("PEXPIRETIME %s = %s, want %d (window end + %v)", hash, got, want, grace)
		}
	}
	wantExpiry(time.Minute)
	send(5*time.Minute, check("c")) // a replica with a longer grace extends it
	wantExpiry(5 * time.Minute)
	send(0, settle("c")) // and one with a shorter one does not shorten it
	wantExpiry(5 * time.Minute)

	// Releasing every hold of a counter deletes its field.
	rs = send(time.Minute, settle("a"), settle("b"))
	if rs[0].Reserved != 0 || rs[1].Reserved != 100 {
		t.Fatalf("settles: %+v, want a's hold gone, one of b's left", rs)
	}
	if got := do("HLEN", hash); got != "1" {
		t.Fatalf("HLEN %s = %s with holds left on one counter, want 1", hash, got)
	}
	send(time.Minute, settle("b"))
	if got := do("EXISTS", hash); got != "0" {
		t.Fatalf("EXISTS %s = %s with no hold left, want the hash gone", hash, got)
	}
	for k, want := range map[string]string{"a": "80", "b": "160", "c": "80"} {
		if got := do("GET", k); got != want {
			t.Fatalf("GET %s = %s, want %s (its charges)", k, got, want)
		}
	}
}

// TestHoldHashesBounded: a call whose reserving counters span more windows
// than an op's kinds byte can name sends the counters past the bound
// without their holds (counted, never under another window's hash) and
// keeps every other counter's.
func TestHoldHashesBounded(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}})
	base := time.Now().Add(time.Hour).Unix()
	n := maxHoldHashes + 3
	cs := make([]store.Counter, n)
	for i := range cs {
		w := base + int64(i)
		cs[i] = store.Counter{Key: "k" + strconv.Itoa(i), Hits: 5, ExpireAt: time.Unix(w, 0), Start: true,
			Limit: 1000, Enforce: true, Hold: store.Hold{Release: 1, Expiry: time.Hour, Window: w}}
	}
	rs := make([]store.Result, n)
	if err := s.Charge(context.Background(), cs, rs); err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if r.Total != 5 {
			t.Fatalf("counter %d: %+v, want its 5 hits counted", i, r)
		}
	}
	hold := func(i int) store.Counter {
		w := base + int64(i)
		return store.Counter{Key: "k" + strconv.Itoa(i), ExpireAt: time.Unix(w, 0), Start: true,
			Limit: 1000, Enforce: true, Hold: store.Hold{Reserve: 7, Expiry: time.Hour, Window: w}}
	}
	for i := range cs {
		cs[i] = hold(i)
	}
	if err := s.Charge(context.Background(), cs, rs); err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if want := i < maxHoldHashes; r.Held != want {
			t.Fatalf("check %d of %d windows: %+v, want held %v", i, n, r, want)
		}
	}
	// The counters past the bound hold on their own, in a call of their own.
	last := n - 1
	one := []store.Counter{hold(last)}
	if err := s.Charge(context.Background(), one, rs[:1]); err != nil {
		t.Fatal(err)
	}
	if !rs[0].Held || rs[0].Reserved != 7 {
		t.Fatalf("check %d alone: %+v, want held, 7 reserved", last, rs[0])
	}
}

// TestBufferedReleaseReplaysIntoItsHash: a charge's hold release made while
// Valkey is down is buffered with its hold hash and, once Valkey is back,
// releases the hold the check placed (the counter's field goes), exactly
// once.
func TestBufferedReleaseReplaysIntoItsHash(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{Args: []string{"--appendonly", "yes", "--appendfsync", "always"}})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}})
	window := time.Now().Add(time.Hour).Unix()
	hash := "bgh|" + strconv.FormatInt(window, 10)
	counter := func(hits, reserve, release uint64) []store.Counter {
		return []store.Counter{{Key: "r", Hits: hits, ExpireAt: time.Unix(window, 0), Start: true, Limit: 1000, Enforce: true,
			Hold: store.Hold{Reserve: reserve, Release: release, Expiry: time.Hour, Window: window}}}
	}
	send := func(cs []store.Counter, d time.Duration) ([]store.Result, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		rs := make([]store.Result, len(cs))
		return rs, s.Charge(ctx, cs, rs)
	}
	for range 2 {
		if rs, err := send(counter(0, 100, 0), 5*time.Second); err != nil || !rs[0].Held {
			t.Fatalf("check: %+v, %v; want held", rs, err)
		}
	}
	srv.Kill()
	waitConnectionsDown(t, s)
	if _, err := send(counter(40, 0, 1), 300*time.Millisecond); err == nil {
		t.Fatal("charge succeeded with Valkey down")
	}
	if st := s.Stats(); st.BufferKeys != 1 || st.Ambiguous != 0 || st.Lost != 0 {
		t.Fatalf("while down: %+v; want the charge buffered", st)
	}
	srv.Restart()
	waitDrained(t, s, 2*time.Second)
	if got, _ := srv.Do("GET", "r"); got != "40" {
		t.Fatalf("counter = %s after the replay, want 40", got)
	}
	rs, err := send(counter(0, 100, 0), 5*time.Second)
	if err != nil || rs[0].Reserved != 200 || rs[0].Total != 40 {
		t.Fatalf("check after the replay: %+v, %v; want one of the two holds released (100 + this one's 100)", rs, err)
	}
	if got, _ := srv.Do("HLEN", hash); got != "1" {
		t.Fatalf("HLEN %s = %s, want the counter's field", hash, got)
	}
}

// TestReleaseReplayedOnce: a charge that releases a hold, sent twice under
// one id (a replay of an applied call), adds its hits and releases its hold
// once; a replay never reads a hold as released twice.
func TestReleaseReplayedOnce(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}})
	now := time.Now()
	window := now.Add(time.Hour).Unix()
	exp := time.Unix(window, 0)
	check := []store.Counter{{Key: "once", ExpireAt: exp, Start: true, Limit: 1000, Enforce: true,
		Hold: store.Hold{Reserve: 50, Expiry: time.Hour, Window: window}}}
	for range 3 {
		if err := s.Charge(context.Background(), check, make([]store.Result, 1)); err != nil {
			t.Fatal(err)
		}
	}
	hash := s.keys.holdHash("once", window, nil)
	g := &group{id: s.ids.next(0, now), hasID: true, ops: []op{{key: "once", holdHash: hash, hits: 9, exp: exp.UnixMilli(),
		flags: flagHold, releases: 1, period: time.Hour.Milliseconds() / 2, ci: -1}}}
	var out [1]opResult
	for range 2 {
		res := s.client.DoMulti(context.Background(), s.scriptCmd(g, false, now))
		s.retryNoScript(context.Background(), []*group{g}, res, now)
		if _, err := parseReply(res[0], g.ops, out[:]); err != nil {
			t.Fatal(err)
		}
		if out[0].Reserved != 100 || out[0].Total != 9 {
			t.Fatalf("send of the release: %+v, want total 9 and 100 still reserved (one of three holds released)", out[0].Result)
		}
	}
}
