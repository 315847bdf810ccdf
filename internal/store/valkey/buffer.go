package valkey

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// buffer holds writes that certainly did not reach Valkey, summed per
// target with their absolute replay deadline (counter adds and hold
// releases per key; the shadow-week ledger's hash-field adds per hash and
// field), and the script groups of calls that were sent but not answered,
// kept whole with their id. Bounded in entries (a counter key, a ledger
// field and each op of a kept group count as one) and in bytes (the strings
// an entry or op holds, plus entryOverhead): a counter key holds descriptor
// values of up to 8 KiB each (internal/ratelimit/key.MaxValueBytes), so the
// entry bound alone let 100,000 long keys take about 800 MiB.
type buffer struct {
	mu       sync.Mutex
	m        map[target]pending
	groups   []*group
	gops     int
	max      int
	bytes    int64
	maxBytes int64
	size     atomic.Int64 // entries now, for readers without mu
	used     atomic.Int64 // bytes now, for readers without mu (Stats)
}

// publish makes the buffer's entries and bytes readable without mu; call
// it with mu held after every change.
func (b *buffer) publish() {
	b.size.Store(int64(len(b.m) + b.gops))
	b.used.Store(b.bytes)
}

// entryOverhead is about what an entry costs besides its strings: its map
// slot (target and pending) and the map's spare room (measured: 227 bytes of
// live heap per entry with 60-byte keys; 16 more since pending keeps its
// release's owner, store.Hold.Owner).
const entryOverhead = 184

// cost is what an entry of t with w's hold hash counts against the byte
// bound. The hold hash is named per window and usually shared, but counted.
func (t target) cost(holdHash string) int64 {
	return int64(len(t.key)+len(t.field)+len(holdHash)) + entryOverhead
}

// cost is what a kept group counts against the byte bound.
func (g *group) cost() int64 {
	n := int64(len(g.id.key)) + entryOverhead
	for i := range g.ops {
		o := &g.ops[i]
		n += int64(len(o.key)+len(o.field)+len(o.holdHash)) + entryOverhead
	}
	return n
}

// target is a counter key (field empty, hash false) or a ledger hash field.
type target struct {
	key, field string
	hash       bool
}

// pending is a write waiting in the buffer: hits, hold releases (with the
// holds' expiry, which gives their generation's length, their hold hash,
// and releaseBy: when the holds they are for have certainly expired; owner:
// store.Hold.Owner, handed back with the holds a replay finds expired) and
// the replay deadline (the counter's expiry).
type pending struct {
	hits, releases uint64
	holdExpiry     time.Duration
	holdHash       string
	releaseBy      time.Time
	exp            time.Time
	owner          any
}

type entry struct {
	target
	pending
}

func newBuffer(max int, maxBytes int64) *buffer {
	return &buffer{m: make(map[target]pending), max: max, maxBytes: maxBytes}
}

// add sums a write into t's entry; false when the buffer is full (the caller
// counts the loss).
func (b *buffer) add(t target, w pending) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.m[t]; ok {
		if p.hits > math.MaxInt64-w.hits {
			return false
		}
		p.hits += w.hits
		p.releases += w.releases
		p.holdExpiry = max(p.holdExpiry, w.holdExpiry)
		if p.owner == nil {
			// A counter is one budget's (its bucket), maybe shared by
			// several Gateways' rules: the first owner gets the expired
			// tokens, as the first call of a live counter would.
			p.owner = w.owner
		}
		if p.holdHash == "" && w.holdHash != "" {
			p.holdHash = w.holdHash
			b.bytes += int64(len(w.holdHash)) // as take will count it
			b.used.Store(b.bytes)
		}
		if p.releaseBy.IsZero() || (!w.releaseBy.IsZero() && w.releaseBy.Before(p.releaseBy)) {
			// Summed releases are dropped together once the earliest one's
			// holds have expired: a hold kept to its expiry holds budget a
			// little longer; a stale release would free another's hold.
			p.releaseBy = w.releaseBy
		}
		b.m[t] = p
		return true
	}
	c := t.cost(w.holdHash)
	if len(b.m)+b.gops >= b.max || b.bytes+c > b.maxBytes {
		return false
	}
	b.m[t] = w
	b.bytes += c
	b.publish()
	return true
}

// addGroup keeps an unanswered call's group whole, with its id; false when
// full.
func (b *buffer) addGroup(g *group) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := g.cost()
	if len(b.m)+b.gops+len(g.ops) > b.max || b.bytes+c > b.maxBytes {
		return false
	}
	b.groups = append(b.groups, g)
	b.gops += len(g.ops)
	b.bytes += c
	b.publish()
	return true
}

// take removes up to n entries and up to n groups, oldest groups first.
func (b *buffer) take(n int) ([]entry, []*group) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]entry, 0, min(n, len(b.m)))
	for t, p := range b.m {
		if len(out) == n {
			break
		}
		out = append(out, entry{target: t, pending: p})
		delete(b.m, t)
		b.bytes -= t.cost(p.holdHash)
	}
	k := min(n, len(b.groups))
	gs := append([]*group(nil), b.groups[:k]...)
	clear(b.groups[:k])
	b.groups = b.groups[k:]
	for _, g := range gs {
		b.gops -= len(g.ops)
		b.bytes -= g.cost()
	}
	b.publish()
	return out, gs
}

// drain empties the buffer and returns what it held.
func (b *buffer) drain() ([]entry, []*group) {
	return b.take(math.MaxInt)
}
