package charge

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Pending charges on a cached over-limit key saturate at the store's signed
// 64-bit range instead of wrapping to a small number.
func TestOverCachePendingSaturates(t *testing.T) {
	c := newOverCache(16)
	k := []byte("k")
	end := time.Now().Add(time.Hour)
	if !c.put(k, 10, 0, end.Unix(), end) {
		t.Fatal("put refused")
	}
	for i := 0; i < 3; i++ {
		if !c.hit(k, 5, 0, math.MaxInt64-1, 0, 0, nil) {
			t.Fatal("cached key not hit")
		}
	}
	out := c.drain(0, nil)
	if len(out) != 1 || out[0].Hits != math.MaxInt64 {
		t.Fatalf("drained %+v, want one counter with Hits = MaxInt64", out)
	}
}

func TestOverLimitCacheBounded(t *testing.T) {
	c := newOverCache(64)
	now := int64(1000)
	for i := 0; i < 10000; i++ {
		c.put([]byte(strings.Repeat("k", i%50)+string(rune(i))), 5, now, now+60, time.Unix(now+60, 0))
	}
	if n := c.len(); n > 64 {
		t.Fatalf("cache holds %d entries, bound is 64", n)
	}
}

// TestOverLimitCacheBoundedInBytes: long counter keys (descriptor values
// up to 8 KiB each) fill the cache's byte bound before its entry count, so
// what it holds stays near cacheMaxBytes however long the keys; entries
// whose window ended make room again, and their bytes are given back.
func TestOverLimitCacheBoundedInBytes(t *testing.T) {
	c := newOverCache(DefaultOverLimitCacheSize)
	now := int64(1000)
	long := strings.Repeat("v", 8<<10)
	kept := 0
	for i := 0; i < 20_000; i++ {
		if c.put([]byte(long+strconv.Itoa(i)), 5, now, now+60, time.Unix(now+60, 0)) {
			kept++
		}
	}
	held := 0
	for i := range c.shards {
		held += c.shards[i].bytes
	}
	if held > cacheMaxBytes || kept != c.len() || kept < cacheMaxBytes/(8<<10)/2 {
		t.Fatalf("kept %d entries (len %d) holding %d bytes, bound %d", kept, c.len(), held, cacheMaxBytes)
	}
	// After the window ends, the drain drops every entry and its bytes.
	c.drain(now+60, nil)
	for i := range c.shards {
		if b := c.shards[i].bytes; b != 0 || len(c.shards[i].m) != 0 {
			t.Fatalf("shard %d holds %d bytes in %d entries after the window", i, b, len(c.shards[i].m))
		}
	}
	// Short keys are not limited by the bytes: the entry count binds.
	for i := 0; i < 2*DefaultOverLimitCacheSize; i++ {
		c.put([]byte("k"+strconv.Itoa(i)), 5, now+60, now+120, time.Unix(now+120, 0))
	}
	if n := c.len(); n < DefaultOverLimitCacheSize*9/10 || n > DefaultOverLimitCacheSize {
		t.Fatalf("short keys: %d entries, want close to the entry bound %d", n, DefaultOverLimitCacheSize)
	}
}

// TestFullCacheSweepsOncePerSecond: a shard full of live entries is walked
// for finished ones at most once a second, not at every put (each walk is
// the whole shard under its lock); entries whose window ended are still
// swept out for a new key the next second.
func TestFullCacheSweepsOncePerSecond(t *testing.T) {
	c := newOverCache(cacheShards) // one entry per shard
	now := int64(1000)
	keyIn := func(shard int, prefix string) []byte {
		for i := 0; ; i++ {
			k := []byte(prefix + strconv.Itoa(i))
			if c.shard(k) == &c.shards[shard] {
				return k
			}
		}
	}
	if !c.put(keyIn(0, "a"), 5, now, now+1, time.Unix(now+1, 0)) {
		t.Fatal("first put refused")
	}
	sh := &c.shards[0]
	if c.put(keyIn(0, "b"), 5, now, now+60, time.Unix(now+60, 0)) || sh.swept != now {
		t.Fatalf("a full shard of live entries took a key (swept at %d)", sh.swept)
	}
	sh.swept = now + 1 // as if a put had already swept at now+1
	if c.put(keyIn(0, "b"), 5, now+1, now+60, time.Unix(now+60, 0)) {
		t.Fatal("a second sweep ran within the same second")
	}
	if !c.put(keyIn(0, "b"), 5, now+2, now+60, time.Unix(now+60, 0)) {
		t.Fatal("the finished entry was not swept out the next second")
	}
}
