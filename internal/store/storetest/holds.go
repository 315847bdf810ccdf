package storetest

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
)

// The reservation part of the suite: what the charger relies on from a
// store's holds (store.Hold).

// reserveCheck is a reserving check of key: hold tokens if admitted (for at
// most holdExpiry), with limit, enforcing or not.
func reserveCheck(key string, tokens, limit uint64, enforce bool, holdExpiry time.Duration) store.Counter {
	return store.Counter{Key: key, ExpireAt: hour(), Start: true, Limit: limit, Enforce: enforce,
		Hold: store.Hold{Reserve: tokens, Expiry: holdExpiry}}
}

// settle is a reserving budget's charge of key: add hits, release a hold.
func settle(key string, hits, limit uint64) store.Counter {
	return store.Counter{Key: key, Hits: hits, ExpireAt: hour(), Start: true, Limit: limit, Enforce: true, Hold: store.Hold{Release: 1, Expiry: time.Hour}}
}

func call(t *testing.T, s store.Store, cs ...store.Counter) []store.Result {
	t.Helper()
	rs := make([]store.Result, len(cs))
	if err := s.Charge(ctx(t), cs, rs); err != nil {
		t.Fatalf("Charge: %v", err)
	}
	return rs
}

// testHoldsAdmitAndRelease: a check is admitted while total + reserved <
// limit and then holds its tokens; a charge adds its real count and releases
// one hold, never below zero.
func testHoldsAdmitAndRelease(t *testing.T, s store.Store, k keyer) {
	key, exp := k.key("r"), time.Hour
	const limit, res = 100, 40
	var held int
	for i := 0; i < 5; i++ {
		r := call(t, s, reserveCheck(key, res, limit, true, exp))[0]
		if r.Held {
			held++
			if r.Reserved != uint64(held*res) {
				t.Fatalf("check %d held: reserved %d, want %d", i, r.Reserved, held*res)
			}
		} else if r.Reserved != 120 {
			t.Fatalf("check %d denied: reserved %d, want 120", i, r.Reserved)
		}
	}
	// 0+0, 0+40, 0+80 < 100 admit; 0+120 does not.
	if held != 3 {
		t.Fatalf("%d of 5 checks held, want 3 (40 each on a cap of 100)", held)
	}
	r := call(t, s, settle(key, 25, limit))[0]
	if r.Total != 25 || r.Reserved != 80 || r.Held {
		t.Fatalf("charge of 25: %+v, want total 25, reserved 80", r)
	}
	// 25 + 80 >= 100: no room; a charge of 10 releases a hold: 35 + 40 < 100.
	if r := call(t, s, reserveCheck(key, res, limit, true, exp))[0]; r.Held {
		t.Fatalf("check at 25 used + 80 held on 100 held: %+v", r)
	}
	call(t, s, settle(key, 10, limit))
	if r := call(t, s, reserveCheck(key, res, limit, true, exp))[0]; !r.Held || r.Reserved != 80 || r.Total != 35 {
		t.Fatalf("check at 35 used + 40 held: %+v, want held, reserved 80", r)
	}
	for i := 0; i < 4; i++ { // 2 holds left; two charges more than holds
		r = call(t, s, settle(key, 1, limit))[0]
	}
	if r.Reserved != 0 || r.Total != 39 {
		t.Fatalf("after releasing every hold and then some: %+v, want reserved 0 (never below), total 39", r)
	}
}

// testHoldsAllOrNone: a request whose enforcing counter is over places no
// hold; an over shadow counter (Enforce false) does not stop the others.
func testHoldsAllOrNone(t *testing.T, s store.Store, k keyer) {
	a, over, exp := k.key("a"), k.key("over"), time.Hour
	charge(t, s, over, 10, hour())
	deny := []store.Counter{reserveCheck(a, 5, 100, true, exp), {Key: over, ExpireAt: hour(), Limit: 5, Enforce: true}}
	rs := call(t, s, deny...)
	if rs[0].Held || rs[0].Reserved != 0 || rs[1].Total != 10 {
		t.Fatalf("request with an enforcing counter over its limit: %+v, want no hold", rs)
	}
	shadow := []store.Counter{reserveCheck(a, 5, 100, true, exp), {Key: over, ExpireAt: hour(), Limit: 5}}
	if rs := call(t, s, shadow...); !rs[0].Held || rs[0].Reserved != 5 {
		t.Fatalf("request whose over counter is in shadow: %+v, want the hold placed", rs)
	}
	// A reserving check over its own limit in shadow still holds nothing,
	// and does not deny an enforcing one.
	b := k.key("b")
	charge(t, s, b, 100, hour())
	both := []store.Counter{reserveCheck(b, 5, 100, false, exp), reserveCheck(a, 5, 100, true, exp)}
	both[1].Start = false
	rs = call(t, s, both...)
	if rs[0].Held || !rs[1].Held || rs[1].Reserved != 10 {
		t.Fatalf("shadow check over, enforcing check under: %+v, want only the second held", rs)
	}
	// Two requests in one call: the second sees the first's hold
	// (30 + 70 is not below 100).
	c := k.key("c")
	charge(t, s, c, 30, hour())
	rs = call(t, s, reserveCheck(c, 70, 100, true, exp), reserveCheck(c, 70, 100, true, exp))
	if !rs[0].Held || rs[1].Held || rs[1].Reserved != 70 {
		t.Fatalf("two requests of one call: %+v, want the first held and the second denied by it", rs)
	}
}

// testHoldsExpire: a hold whose charge never comes is dropped within its
// expiry and reported; the budget is free again.
func testHoldsExpire(t *testing.T, s store.Store, k keyer) {
	key := k.key("e")
	const soon = 300 * time.Millisecond
	for i := 0; i < 2; i++ {
		if r := call(t, s, reserveCheck(key, 50, 100, true, soon))[0]; !r.Held {
			t.Fatalf("hold %d not placed: %+v", i, r)
		}
	}
	if r := call(t, s, reserveCheck(key, 50, 100, true, soon))[0]; r.Held {
		t.Fatalf("third hold placed on 100 of 100 held: %+v", r)
	}
	time.Sleep(500 * time.Millisecond)
	r := call(t, s, reserveCheck(key, 40, 100, true, time.Hour))[0]
	if r.Expired != 100 || !r.Held || r.Reserved != 40 {
		t.Fatalf("after the holds' expiry: %+v, want 100 expired, the new hold placed, 40 reserved", r)
	}
	if r := call(t, s, settle(key, 10, 100))[0]; r.Expired != 0 || r.Reserved != 0 || r.Total != 10 {
		t.Fatalf("charge after: %+v, want the live hold released, nothing more expired", r)
	}
}

// testHoldsConcurrent: 100 concurrent checks of 50,000 tokens on a cap of
// 2,000,000 (the runaway agent): exactly 40 hold, whatever the interleaving.
func testHoldsConcurrent(t *testing.T, s store.Store, k keyer) {
	key, exp := k.key("fan"), time.Hour
	var held atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs := make([]store.Result, 1)
			if err := s.Charge(ctx(t), []store.Counter{reserveCheck(key, 50_000, 2_000_000, true, exp)}, rs); err != nil {
				t.Error(err)
				return
			}
			if rs[0].Held {
				held.Add(1)
			}
		}()
	}
	wg.Wait()
	if held.Load() != 40 {
		t.Fatalf("%d of 100 concurrent checks held 50,000 on a 2,000,000 cap, want 40", held.Load())
	}
}

// testHoldsByWindow: holds given a Window are shared by every call for the
// counter whatever its expiry (replicas with another expiry grace), and a
// released hold frees the budget for the next.
func testHoldsByWindow(t *testing.T, s store.Store, k keyer) {
	key := k.key("w")
	window := time.Now().Add(time.Hour).Unix()
	check := func(grace time.Duration) store.Counter {
		c := reserveCheck(key, 60, 100, true, time.Hour)
		c.ExpireAt = time.Unix(window, 0).Add(grace)
		c.Hold.Window = window
		return c
	}
	if r := call(t, s, check(0))[0]; !r.Held || r.Reserved != 60 {
		t.Fatalf("first check: %+v, want held, 60 reserved", r)
	}
	// Other replicas, other graces: each sees the holds before it.
	if r := call(t, s, check(5*time.Minute))[0]; !r.Held || r.Reserved != 120 {
		t.Fatalf("second check, another expiry: %+v, want held beside the first (120 reserved)", r)
	}
	if r := call(t, s, check(time.Minute))[0]; r.Held || r.Reserved != 120 {
		t.Fatalf("third check, another expiry: %+v, want denied by the two holds (0 + 120 is not below 100)", r)
	}
	c := settle(key, 30, 100)
	c.ExpireAt, c.Hold.Window = time.Unix(window, 0).Add(time.Minute), window
	if r := call(t, s, c)[0]; r.Total != 30 || r.Reserved != 60 {
		t.Fatalf("charge: %+v, want total 30, one hold released (60 reserved)", r)
	}
	if r := call(t, s, check(2*time.Minute))[0]; !r.Held || r.Reserved != 120 || r.Total != 30 {
		t.Fatalf("check after the charge: %+v, want held on 30 used + 60 reserved, 120 reserved after", r)
	}
}

// testCheckAfterChargeInOneCall: a reserving check that follows a charge of
// the same counter in one call decides on the charged total.
func testCheckAfterChargeInOneCall(t *testing.T, s store.Store, k keyer) {
	key := k.key("cc")
	add := store.Counter{Key: key, Hits: 70, ExpireAt: hour(), Start: true}
	rs := call(t, s, add, reserveCheck(key, 40, 100, true, time.Hour))
	if rs[0].Total != 70 || rs[1].Total != 70 || !rs[1].Held || rs[1].Reserved != 40 {
		t.Fatalf("charge then check in one call: %+v, want both at 70, the check held (70 + 0 < 100)", rs)
	}
	if r := call(t, s, reserveCheck(key, 40, 100, true, time.Hour))[0]; r.Held || r.Total != 70 || r.Reserved != 40 {
		t.Fatalf("next check: %+v, want denied on 70 + 40", r)
	}
}
