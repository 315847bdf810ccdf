package valkey

import (
	"hash/maphash"
	"sync"
)

// expiryCache remembers counters whose absolute expiry is known to be set in
// Valkey (this store's PEXPIREAT NX was answered, or INCRBY showed that
// another call had created the counter), so that later charges of the
// counter send INCRBY alone. A counter not in the cache gets INCRBY and
// PEXPIREAT NX in the same round trip, as always. If Valkey loses a cached
// counter (a restart without persistence, a failover), the INCRBY that
// recreates it returns exactly its own hits and the store then sets the
// expiry in a second round trip (Store.setExpiries): no counter is left
// without one.
//
// Bounded: a shard that is full drops the entries whose window has ended,
// and if that is not enough, all of them. Forgetting costs only a PEXPIREAT
// NX (idempotent) on the counter's next charge.
type expiryCache struct {
	seed     maphash.Seed
	perShard int
	shards   [16]struct {
		mu sync.Mutex
		m  map[string]int64 // key -> expiry (Unix ms) it was set to
	}
}

func newExpiryCache(maxKeys int) *expiryCache {
	c := &expiryCache{seed: maphash.MakeSeed(), perShard: max(1, maxKeys/16)}
	for i := range c.shards {
		c.shards[i].m = map[string]int64{}
	}
	return c
}

func (c *expiryCache) shard(key string) int {
	return int(maphash.String(c.seed, key) % uint64(len(c.shards)))
}

// has reports whether key is known to expire at expMs.
func (c *expiryCache) has(key string, expMs int64) bool {
	if c == nil {
		return false
	}
	sh := &c.shards[c.shard(key)]
	sh.mu.Lock()
	v, ok := sh.m[key]
	sh.mu.Unlock()
	return ok && v == expMs
}

// add records that key expires at expMs; nowMs drives eviction.
func (c *expiryCache) add(key string, expMs, nowMs int64) {
	if c == nil {
		return
	}
	sh := &c.shards[c.shard(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[key]; !ok && len(sh.m) >= c.perShard {
		for k, v := range sh.m {
			if v <= nowMs {
				delete(sh.m, k)
			}
		}
		if len(sh.m) >= c.perShard {
			clear(sh.m)
		}
	}
	sh.m[key] = expMs
}

// forget drops key: its next charge sends PEXPIREAT NX again. Used when a
// counter may exist without its expiry (a recreating call failed or went
// unanswered).
func (c *expiryCache) forget(key string) {
	if c == nil {
		return
	}
	sh := &c.shards[c.shard(key)]
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
}

func (c *expiryCache) len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].m)
		c.shards[i].mu.Unlock()
	}
	return n
}
