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
// kept whole with their id. Bounded in entries: a counter key, a ledger field
// and each op of a kept group count as one.
type buffer struct {
	mu     sync.Mutex
	m      map[target]pending
	groups []*group
	gops   int
	max    int
	size   atomic.Int64
}

// target is a counter key (field empty, hash false) or a ledger hash field.
type target struct {
	key, field string
	hash       bool
}

// pending is a write waiting in the buffer: hits, hold releases (with the
// holds' expiry, which gives their generation's length, their hold hash,
// and releaseBy: when the holds they are for have certainly expired) and
// the replay deadline (the counter's expiry).
type pending struct {
	hits, releases uint64
	holdExpiry     time.Duration
	holdHash       string
	releaseBy      time.Time
	exp            time.Time
}

type entry struct {
	target
	pending
}

func newBuffer(max int) *buffer { return &buffer{m: make(map[target]pending), max: max} }

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
		if p.holdHash == "" {
			p.holdHash = w.holdHash
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
	if len(b.m)+b.gops >= b.max {
		return false
	}
	b.m[t] = w
	b.size.Store(int64(len(b.m) + b.gops))
	return true
}

// addGroup keeps an unanswered call's group whole, with its id; false when
// full.
func (b *buffer) addGroup(g *group) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.m)+b.gops+len(g.ops) > b.max {
		return false
	}
	b.groups = append(b.groups, g)
	b.gops += len(g.ops)
	b.size.Store(int64(len(b.m) + b.gops))
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
	}
	k := min(n, len(b.groups))
	gs := append([]*group(nil), b.groups[:k]...)
	clear(b.groups[:k])
	b.groups = b.groups[k:]
	for _, g := range gs {
		b.gops -= len(g.ops)
	}
	b.size.Store(int64(len(b.m) + b.gops))
	return out, gs
}

// drain empties the buffer and returns what it held.
func (b *buffer) drain() ([]entry, []*group) {
	return b.take(math.MaxInt)
}
