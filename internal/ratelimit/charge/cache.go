package charge

import (
	"hash/maphash"
	"math"
	"sync"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
)

// overCache remembers counters already seen above their limit, until their
// window ends, so an exhausted principal's checks need no store round trip.
//
// Correctness: a counter only grows within its window (keys name the window),
// so once a total above the limit was observed every later call in the same
// window is OVER_LIMIT, whatever it adds. The answer is therefore identical to
// asking the store. The reference still charges over-limit hits, and so do we:
// hits on a cached key are added to the entry's pending count and charged in
// background batches (one INCRBY per key per flush, FlushInterval apart). The
// store's counter lags by at most one flush interval; a crash loses at most
// that interval's over-limit hits, which were denied anyway. An entry is keyed
// by the full counter key and remembers the observed total, so a limit raised
// by a config change is compared against that total (a miss if no longer over).
type overCache struct {
	shards        []cacheShard
	perShard      int
	perShardBytes int
	seed          maphash.Seed
}

type cacheShard struct {
	mu    sync.Mutex
	m     map[string]*cacheEntry
	bytes int // entrySize of every entry in m
	// swept is the second of the last sweep for finished entries: a full
	// shard is swept at most once a second, not at every put (a sweep is a
	// walk of the whole shard under its lock).
	swept int64
	_     [24]byte
}

// cacheMaxBytes bounds what the cache's keys and entries hold, beside its
// entry count: a counter key carries its descriptor values (up to 8 KiB
// each), so 100,000 entries of long keys would hold gigabytes. Typical
// keys (100-200 bytes) fill the entry count first.
const cacheMaxBytes = 32 << 20

// entrySize is what one entry holds: its key, the entry and the map's slot
// (measured with a heap profile to within a few bytes; the bound needs the
// order of magnitude, not the byte).
func entrySize(k string) int { return len(k) + 120 }

type cacheEntry struct {
	observed  uint64
	windowEnd int64 // Unix seconds; the entry is useless from then on
	expireAt  time.Time
	pending   uint64
	releases  uint64 // holds the pending charges release
	// holdExpiry is the holds' lifetime the releases were asked with.
	holdExpiry time.Duration
	// owner is the releases' store.Hold.Owner (their limit), so tokens of
	// holds the flushed releases find expired are counted under it.
	owner any
}

const cacheShards = 32

func newOverCache(size int) *overCache {
	if size <= 0 {
		return nil
	}
	per := size / cacheShards
	if per < 1 {
		per = 1
	}
	c := &overCache{shards: make([]cacheShard, cacheShards), perShard: per, perShardBytes: cacheMaxBytes / cacheShards, seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string]*cacheEntry)
		c.shards[i].swept = math.MinInt64 // the first full put sweeps, whatever the clock
	}
	return c
}

func (c *overCache) shard(k []byte) *cacheShard {
	return &c.shards[maphash.Bytes(c.seed, k)&(cacheShards-1)]
}

// hit reports whether key is known over limit at nowSec, and if so adds hits
// (and the holds they release, for owner) to its pending charge.
func (c *overCache) hit(k []byte, limit uint64, nowSec int64, hits, releases uint64, holdExpiry time.Duration, owner any) bool {
	sh := c.shard(k)
	sh.mu.Lock()
	e := sh.m[string(k)]
	if e == nil || nowSec >= e.windowEnd || e.observed <= limit {
		sh.mu.Unlock()
		return false
	}
	// Saturate rather than wrap: counters are signed 64-bit in Valkey, and a
	// wrapped sum would charge a tiny amount for an enormous one.
	if hits > math.MaxInt64-min(e.pending, math.MaxInt64) {
		e.pending = math.MaxInt64
	} else {
		e.pending += hits
	}
	e.releases += releases
	if releases > 0 {
		e.holdExpiry, e.owner = holdExpiry, owner
	}
	sh.mu.Unlock()
	return true
}

// put records an observed total above the limit. It reports false when the
// shard is full of live entries (the cache is an optimisation; nothing breaks).
func (c *overCache) put(k []byte, observed uint64, nowSec, windowEnd int64, expireAt time.Time) bool {
	sh := c.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[string(k)]; e != nil {
		if observed > e.observed {
			e.observed = observed
		}
		return true
	}
	size := entrySize(string(k))
	full := func() bool { return len(sh.m) >= c.perShard || sh.bytes+size > c.perShardBytes }
	if full() && nowSec != sh.swept {
		sh.swept = nowSec
		for key, e := range sh.m {
			if nowSec >= e.windowEnd && e.pending == 0 && e.releases == 0 {
				sh.remove(key)
			}
		}
	}
	if full() {
		return false
	}
	sh.m[string(k)] = &cacheEntry{observed: observed, windowEnd: windowEnd, expireAt: expireAt}
	sh.bytes += size
	return true
}

// drain moves pending hits into counters and drops finished entries.
func (c *overCache) drain(nowSec int64, out []store.Counter) []store.Counter {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.pending > 0 || e.releases > 0 {
				out = append(out, store.Counter{Key: k, Hits: e.pending, ExpireAt: e.expireAt, Hold: store.Hold{Release: e.releases, Expiry: e.holdExpiry, Window: e.windowEnd, Owner: e.owner}})
				e.pending, e.releases = 0, 0
			}
			if nowSec >= e.windowEnd {
				sh.remove(k)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// remove deletes key's entry; the shard's lock is held.
func (sh *cacheShard) remove(key string) {
	delete(sh.m, key)
	sh.bytes -= entrySize(key)
}

func (c *overCache) len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].m)
		c.shards[i].mu.Unlock()
	}
	return n
}
