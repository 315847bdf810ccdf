package memory

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
)

// longKey is a distinct key of n bytes (a long descriptor value).
func longKey(i, n int) string {
	p := fmt.Sprintf("k%06d", i)
	return p + strings.Repeat("x", n-len(p))
}

// TestByteBoundRefusesAsCounterBound: a counter's key can be 8 KiB, so
// MaxCounters alone let the store hold gigabytes. MaxBytes bounds its keys
// plus CounterOverhead each; at it, a call needing a new counter is refused
// whole with ErrFull (Stats.Refused, FullPolicy) as at MaxCounters, existing
// counters keep counting, checks of new keys answer, and room comes back
// when windows end.
func TestByteBoundRefusesAsCounterBound(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1_000_000, 0)}
	const keyLen = 1000
	size := int64(keyLen + CounterOverhead)
	s := New(Options{Now: clk.Now, MaxBytes: 10 * size, Shards: 1, SweepInterval: time.Hour})
	defer s.Close()
	exp := clk.Now().Add(time.Minute)
	for i := range 10 {
		if _, err := charge(t, s, longKey(i, keyLen), 1, exp); err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	if st := s.Stats(); st.Bytes != 10*size || st.MaxBytes != 10*size || st.Counters != 10 {
		t.Fatalf("stats %+v, want 10 counters of %d bytes", st, size)
	}
	_, err := charge(t, s, longKey(10, keyLen), 1, exp)
	if !errors.Is(err, ErrFull) || !errors.Is(err, store.ErrFull) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("11th key: err = %v, want ErrFull (the default policy denies)", err)
	}
	// A short new key still fits in what is left; a call with a new long
	// key is refused whole.
	if _, err := charge(t, s, "short", 1, exp); !errors.Is(err, ErrFull) {
		t.Fatalf("a new key past the byte bound: %v, want ErrFull", err)
	}
	totals := make([]store.Result, 2)
	err = s.Charge(context.Background(), []store.Counter{{Key: longKey(0, keyLen), Hits: 1, ExpireAt: exp}, {Key: longKey(11, keyLen), Hits: 1, ExpireAt: exp}}, totals)
	if !errors.Is(err, ErrFull) {
		t.Fatalf("mixed call: %v", err)
	}
	if got, err := charge(t, s, longKey(0, keyLen), 4, exp); err != nil || got != 5 {
		t.Fatalf("existing key at the byte bound = %d, %v; want 5 (the refused call changed nothing)", got, err)
	}
	if got, err := charge(t, s, "absent", 0, exp); err != nil || got != 0 {
		t.Fatalf("check at the byte bound = %d, %v", got, err)
	}
	if st := s.Stats(); st.Refused != 3 || st.Bytes != 10*size {
		t.Fatalf("stats %+v, want 3 refused and the bytes unchanged", st)
	}
	clk.Add(2 * time.Minute) // the windows end
	if _, err := charge(t, s, longKey(12, keyLen), 1, clk.Now().Add(time.Minute)); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if st := s.Stats(); st.Bytes != size || st.Counters != 1 {
		t.Fatalf("stats after expiry %+v, want one counter of %d bytes", st, size)
	}

	ff := New(Options{MaxBytes: size, FullPolicy: FullFailurePolicy})
	defer ff.Close()
	later := time.Now().Add(time.Hour)
	if _, err := charge(t, ff, longKey(0, keyLen), 1, later); err != nil {
		t.Fatal(err)
	}
	if _, err := charge(t, ff, longKey(1, keyLen), 1, later); !errors.Is(err, ErrFull) || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("MEMORY_FULL_POLICY=failure-policy at the byte bound: %v, want ErrFull and ErrUnavailable", err)
	}
}

// TestByteBoundSnapshotRoundTrip: a snapshot restored into a store with the
// same MaxBytes holds the same bytes and refuses a new counter as the
// original did; into a store with a lower MaxBytes every counter is kept
// (a dropped one is a budget forgotten), those past the bound are counted
// OverBound and new counters are refused.
func TestByteBoundSnapshotRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "snap")
	const keyLen = 2000
	size := int64(keyLen + CounterOverhead)
	s := New(Options{MaxBytes: 5 * size})
	defer s.Close()
	exp := time.Now().Add(time.Hour)
	for i := range 5 {
		if _, err := charge(t, s, longKey(i, keyLen), uint64(i+1), exp); err != nil {
			t.Fatal(err)
		}
	}
	if err := (&Snapshotter{Path: path, Store: s}).Write(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		max       int64
		overBound int
	}{{5 * size, 0}, {3 * size, 2}} {
		s2 := New(Options{MaxBytes: tc.max})
		st, err := (&Snapshotter{Path: path, Store: s2}).Restore()
		if err != nil || st.Counters != 5 || st.OverBound != tc.overBound {
			t.Errorf("restore into MaxBytes %d: %+v, %v; want 5 counters, %d over the bound", tc.max, st, err, tc.overBound)
		}
		if got := s2.Stats().Bytes; got != 5*size {
			t.Errorf("restored bytes %d, want %d", got, 5*size)
		}
		if got, err := charge(t, s2, longKey(4, keyLen), 1, exp); err != nil || got != 6 {
			t.Errorf("a restored counter: %d, %v; want 6", got, err)
		}
		if _, err := charge(t, s2, longKey(9, keyLen), 1, exp); !errors.Is(err, ErrFull) {
			t.Errorf("a new counter after restoring into MaxBytes %d: %v, want ErrFull", tc.max, err)
		}
		s2.Close()
	}
}

// TestCounterOverheadCoversTheHeap: what the store counts against MaxBytes
// (its keys plus CounterOverhead each) is at least what its counters hold
// on the heap (runtime.MemStats after GC), within the size class rounding
// of long keys, for plain and reserving counters, short and 8 KiB keys.
func TestCounterOverheadCoversTheHeap(t *testing.T) {
	for _, tc := range []struct {
		n, keyLen int
		reserve   bool
	}{{50_000, 60, false}, {50_000, 60, true}, {2_000, 8192, true}} {
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		s := New(Options{MaxCounters: tc.n, MaxBytes: 1 << 40, SweepInterval: time.Hour})
		exp := time.Now().Add(time.Hour)
		rs := make([]store.Result, 1)
		for i := range tc.n {
			c := store.Counter{Key: longKey(i, tc.keyLen), Hits: 1, ExpireAt: exp}
			if tc.reserve {
				c = store.Counter{Key: c.Key, ExpireAt: exp, Limit: 100, Hold: store.Hold{Reserve: 1, Expiry: time.Minute}}
			}
			if err := s.Charge(context.Background(), []store.Counter{c}, rs); err != nil {
				t.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		heap, counted := int64(m1.HeapAlloc)-int64(m0.HeapAlloc), s.Stats().Bytes
		t.Logf("%d counters, %d-byte keys, reserving %t: heap %d B/counter, counted %d", tc.n, tc.keyLen, tc.reserve, heap/int64(tc.n), counted/int64(tc.n))
		if float64(heap) > 1.05*float64(counted) {
			t.Errorf("%d-byte keys, reserving %t: %d bytes of heap, %d counted against MaxBytes", tc.keyLen, tc.reserve, heap, counted)
		}
		runtime.KeepAlive(s)
		s.Close()
	}
}
