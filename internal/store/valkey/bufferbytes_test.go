package valkey

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// TestOutageBufferBoundedInBytes: the outage buffer was bounded in entries
// only (BufferMaxKeys, 100,000), and an entry holds its counter's key, whose
// descriptor values are kept as they are up to 8 KiB each
// (internal/ratelimit/key.MaxValueBytes): a client choosing a long principal
// header during an outage filled the default buffer with about 800 MiB of
// keys, more than a pod is given, and an OOM kill loses every buffered hit.
// With the default options, 12,000 new 8 KiB keys deferred during an outage
// (96 MiB of keys) must leave the buffer's live heap within its byte bound,
// the hits refused beyond it counted lost.
func TestOutageBufferBoundedInBytes(t *testing.T) {
	f := &fakeClient{do: func(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult {
		return errResults(len(multi), errors.New("valkey down"))
	}}
	s := storeOver(t, f, Options{ReplayInterval: time.Hour})
	exp := time.Now().Add(time.Hour)
	const keys, keyBytes = 12_000, 8 << 10
	pad := strings.Repeat("x", keyBytes-10)
	before := liveHeap()
	for i := range keys {
		// Each key is made here and kept only by the buffer.
		s.Defer([]store.Counter{{Key: pad + strconv.Itoa(1_000_000_000+i), Hits: 1, ExpireAt: exp}})
	}
	grew := liveHeap() - before
	st := s.Stats()
	t.Logf("%d keys of %d bytes deferred: buffer %d entries, %d hits buffered, %d lost; live heap +%.1f MiB", keys, keyBytes, st.BufferKeys, st.Buffered, st.Lost, float64(grew)/(1<<20))
	if bound := int64(DefaultBufferMaxBytes) * 5 / 4; grew > bound {
		t.Errorf("the outage buffer holds %.1f MiB of live heap, above its byte bound (%d MiB, +25%% for the runtime)", float64(grew)/(1<<20), bound>>20)
	}
	if st.Buffered+st.Lost != keys || st.Lost == 0 {
		t.Errorf("buffered %d + lost %d, want %d hits, some lost at the bound", st.Buffered, st.Lost, keys)
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestBufferBytesBalance: what the buffer counts against its byte bound
// comes back out when its entries and groups are taken, merges included,
// so the bound never drifts.
func TestBufferBytesBalance(t *testing.T) {
	b := newBuffer(100, 1<<20)
	exp := time.Now().Add(time.Hour)
	for i := range 5 {
		k := counterTarget("key" + strconv.Itoa(i))
		if !b.add(k, pending{hits: 1, exp: exp}) || !b.add(k, pending{hits: 1, releases: 1, holdHash: "bgh|123", exp: exp}) {
			t.Fatal("add refused below the bounds")
		}
	}
	g := &group{id: idRef{key: "bgid|x|1"}, ops: []op{{key: "a", holdHash: "bgh|1"}, {key: "l", field: "f", flags: flagHash}}}
	if !b.addGroup(g) {
		t.Fatal("addGroup refused below the bounds")
	}
	if b.bytes <= 0 || b.used.Load() != b.bytes {
		t.Fatalf("bytes %d (published %d) after adds", b.bytes, b.used.Load())
	}
	b.take(2)
	if b.used.Load() != b.bytes {
		t.Fatalf("published %d bytes after a take, buffer %d", b.used.Load(), b.bytes)
	}
	b.drain()
	if b.bytes != 0 || b.size.Load() != 0 || b.used.Load() != 0 {
		t.Fatalf("bytes %d (published %d), size %d after draining, want 0, 0", b.bytes, b.used.Load(), b.size.Load())
	}
	small := newBuffer(100, 2*entryOverhead)
	if !small.add(counterTarget("a"), pending{hits: 1}) || small.add(counterTarget(strings.Repeat("k", entryOverhead)), pending{hits: 1}) {
		t.Fatal("the byte bound: want the first entry in, the second refused")
	}
	if !small.add(counterTarget("a"), pending{hits: 1}) {
		t.Fatal("a merge into an existing entry takes no room")
	}
}
