package valkey

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// TestKeySlotAndTags: our slot function agrees with the server's CLUSTER
// KEYSLOT (hash tags included), and every slot's id tag hashes to it.
func TestKeySlotAndTags(t *testing.T) {
	t.Parallel() // its own servers; no fault, no timing bound
	c := valkeytest.StartCluster(t, 3)
	for _, k := range []string{"a", "bg1|default/llm|rule-0|user|u1|86400|1764460800", "x{user1}y", "{}a", "a{", "{a}{b}", "pre{}{x}"} {
		out, err := valkeytest.Do(c.Addrs[0], "CLUSTER", "KEYSLOT", k)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := strconv.Atoi(out); int(keySlot(k)) != want {
			t.Errorf("keySlot(%q) = %d, server says %d", k, keySlot(k), want)
		}
	}
	tags := slotTags()
	for sl, tag := range tags {
		if got := keySlot("bgid|{" + tag + "}x"); int(got) != sl {
			t.Fatalf("tag %q of slot %d hashes to %d", tag, sl, got)
		}
	}
}

// TestClusterManySlots: one call over counters of the three nodes is one
// script call per slot, each applied on its own node.
func TestClusterManySlots(t *testing.T) {
	t.Parallel() // its own servers; no fault, no timing bound
	c := valkeytest.StartCluster(t, 3)
	s := mustNew(t, Options{Addresses: c.Addrs[:1], Mode: Cluster})
	exp := time.Now().Add(time.Hour)
	var cs []store.Counter
	for i := 0; i < 12; i++ {
		cs = append(cs, store.Counter{Key: "k" + strconv.Itoa(i), Hits: uint64(i + 1), ExpireAt: exp})
	}
	cs = append(cs, store.Counter{Key: "k0"}) // check only
	totals := make([]store.Result, len(cs))
	for round := uint64(1); round <= 2; round++ {
		if err := s.Charge(context.Background(), cs, totals); err != nil {
			t.Fatal(err)
		}
		for i, k := range cs[:12] {
			if totals[i].Total != round*k.Hits {
				t.Fatalf("round %d: total %d = %d, want %d", round, i, totals[i].Total, round*k.Hits)
			}
		}
	}
	for _, k := range cs[:12] {
		slot, _ := valkeytest.Do(c.Addrs[0], "CLUSTER", "KEYSLOT", k.Key)
		n, _ := strconv.Atoi(slot)
		owner, err := valkeytest.SlotOwner(c.Addrs[0], n)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := valkeytest.Do(owner, "GET", k.Key); got != strconv.FormatUint(2*k.Hits, 10) {
			t.Fatalf("GET %s on %s = %q", k.Key, owner, got)
		}
	}
}

// TestReplayOnce: a call replayed under an id Valkey has already seen is not
// counted again (the first send was applied), and one under a new id is.
func TestReplayOnce(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, Options{Addresses: []string{srv.Addr}})
	now := time.Now()
	exp := now.Add(time.Hour).UnixMilli()
	g := &group{id: s.ids.next(0, now), hasID: true, ops: []op{{key: "once", hits: 7, exp: exp, ci: -1}}}
	for range 2 {
		res := s.client.DoMulti(context.Background(), s.scriptCmd(g, false, now))
		s.retryNoScript(context.Background(), []*group{g}, res, now)
		if _, err := parseReply(res[0], g.ops, make([]opResult, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := srv.Do("GET", "once"); got != "7" {
		t.Fatalf("after two sends of one id: %s, want 7", got)
	}
	// The replayer path: an unanswered call kept with its id.
	s.tally.Add(store.TargetCounter, store.Ambiguous, 7)
	s.keep(g, store.AmbiguousDropped)
	waitDrained(t, s, 2*time.Second)
	if got, _ := srv.Do("GET", "once"); got != "7" {
		t.Fatalf("after the replay: %s, want 7", got)
	}
	if st := s.Stats(); st.AmbiguousApplied != 7 || st.AmbiguousReplayed != 0 {
		t.Fatalf("stats %+v: want 7 ambiguous hits found applied", st)
	}
	// NOSCRIPT: the script cache is flushed (a restart does the same).
	if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if err := s.Charge(context.Background(), []store.Counter{{Key: "once", Hits: 1, ExpireAt: time.UnixMilli(exp)}}, make([]store.Result, 1)); err != nil {
		t.Fatalf("charge after SCRIPT FLUSH: %v", err)
	}
	if got, _ := srv.Do("GET", "once"); got != "8" {
		t.Fatalf("after SCRIPT FLUSH: %s, want 8", got)
	}
}

// checkExactHits asserts the exact accounting of charges:
// every attempted hit is in exactly one class on the charge path, every
// buffered or ambiguous hit was resolved, none given up, and Valkey holds
// exactly acknowledged + applied-on-error + replayed + ambiguous-applied +
// ambiguous-replayed = attempted - canceled (calls whose context was done on
// entry, when the load stops: never sent).
func checkExactHits(t *testing.T, s *Store, attempted, acked, final uint64) {
	t.Helper()
	st := s.Stats()
	t.Logf("attempted %d, acknowledged %d, stats %+v, in valkey %d", attempted, acked, st, final)
	if st.Lost != 0 || st.Expired != 0 || st.AmbiguousDropped != 0 || st.BufferKeys != 0 {
		t.Errorf("lost %d, expired %d, ambiguous dropped %d, still buffered %d: want none", st.Lost, st.Expired, st.AmbiguousDropped, st.BufferKeys)
	}
	if got := acked + st.AppliedOnError + st.Buffered + st.Ambiguous + st.Canceled; got != attempted {
		t.Errorf("charge path: acknowledged+appliedOnError+buffered+ambiguous+canceled = %d, attempted %d", got, attempted)
	}
	if st.Replayed != st.Buffered {
		t.Errorf("replayed %d != buffered %d", st.Replayed, st.Buffered)
	}
	if st.AmbiguousApplied+st.AmbiguousReplayed != st.Ambiguous {
		t.Errorf("ambiguous %d resolved as applied %d + replayed %d", st.Ambiguous, st.AmbiguousApplied, st.AmbiguousReplayed)
	}
	if want := acked + st.AppliedOnError + st.Replayed + st.AmbiguousApplied + st.AmbiguousReplayed; final != want || final != attempted-st.Canceled {
		t.Errorf("valkey holds %d, want exactly %d (= attempted %d - canceled %d)", final, want, attempted, st.Canceled)
	}
}

// faultOptions tear a silent connection down quickly (about 0.6 s), so a
// 3 s fault certainly leaves calls sent but unanswered.
func faultOptions(addr string) Options {
	return Options{Addresses: []string{addr}, PingInterval: 200 * time.Millisecond, ConnWriteTimeout: 200 * time.Millisecond, DialTimeout: 200 * time.Millisecond}
}

// TestPauseWriteExactlyOnce: CLIENT PAUSE WRITE for 3 s under load. Calls in
// flight when the pause starts block, their connections are torn down, and
// they are ambiguous; each is replayed under its id, so Valkey ends with
// exactly the hits charged.
func TestPauseWriteExactlyOnce(t *testing.T) {
	srv := valkeytest.Start(t, valkeytest.Options{})
	s := mustNew(t, faultOptions(srv.Addr))
	l := startLoad(s, "pause", 8, callDeadline)
	time.Sleep(500 * time.Millisecond) // stays: load before the pause
	if _, err := srv.Do("CLIENT", "PAUSE", "3000", "WRITE"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second) // stays: load through the 3 s pause and after it
	l.finish()
	waitDrained(t, s, 10*time.Second)
	st := s.Stats()
	if st.Ambiguous == 0 {
		t.Fatalf("no call was ambiguous: the pause tested nothing (%+v)", st)
	}
	checkExactHits(t, s, l.attempted.Load(), l.okHits.Load(), sumKeys(t, srv.Addr, l))
}

// TestBlackHoleExactlyOnce: a loopback proxy between the store and Valkey
// stops forwarding in both directions for 3 s without closing anything.
// The requests held on a connection the client tears down meanwhile are
// delivered to Valkey (applied, the answer lost) or dropped (never
// applied), so each way of resolving an ambiguous call occurs; Valkey ends
// exact either way.
func TestBlackHoleExactlyOnce(t *testing.T) {
	for _, deliver := range []bool{true, false} {
		t.Run("delivered="+strconv.FormatBool(deliver), func(t *testing.T) {
			srv := valkeytest.Start(t, valkeytest.Options{})
			p := valkeytest.StartProxy(t, srv.Addr)
			s := mustNew(t, faultOptions(p.Addr))
			l := startLoad(s, "hole", 8, callDeadline)
			time.Sleep(500 * time.Millisecond) // stays: load before the hold
			p.Hold(deliver)
			time.Sleep(3 * time.Second) // stays: the hold lasts 3 s
			p.Pass()
			time.Sleep(time.Second) // stays: load after the hold
			l.finish()
			waitDrained(t, s, 10*time.Second)
			st := s.Stats()
			ps := p.Stats()
			t.Logf("proxy: %d torn-down connections delivered their held requests, %d dropped them", ps.Delivered, ps.Dropped)
			if deliver && st.AmbiguousApplied == 0 {
				t.Errorf("held requests delivered, yet no replay found its call applied: %+v", st)
			}
			// (A call forwarded just before the hole opened is applied with
			// its answer held: found applied even when nothing is delivered.)
			if !deliver && st.AmbiguousReplayed == 0 {
				t.Errorf("held requests dropped, yet no replay applied a call: %+v", st)
			}
			checkExactHits(t, s, l.attempted.Load(), l.okHits.Load(), sumKeys(t, srv.Addr, l))
		})
	}
}
