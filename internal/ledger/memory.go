package ledger

import (
	"context"
	"sync"
	"time"
)

// Memory is the ledger of the embedded store: a small set of hashes with
// absolute expiry, the same layout as in Valkey. It is both the Sink of a
// Recorder and a Reader, and the embedded store calls HIncrBy for usage.
type Memory struct {
	prefix string
	now    func() time.Time
	// MaxFields bounds the principal-days held (all hashes together); past
	// it new fields are dropped and counted in Dropped. Default
	// DefaultMemoryMaxFields. Set before use.
	MaxFields int

	mu      sync.Mutex
	hashes  map[string]*memHash
	fields  int
	dropped uint64
}

// DefaultMemoryMaxFields bounds the in-memory ledger: about 100 MB.
const DefaultMemoryMaxFields = 1_000_000

type memHash struct {
	fields   map[string]uint64
	expireAt time.Time // zero: none yet
}

// NewMemory returns an empty in-memory ledger using prefix (Options.Prefix)
// and the clock now (time.Now when nil).
func NewMemory(prefix string, now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{prefix: prefix, now: now, hashes: map[string]*memHash{}}
}

func (m *Memory) live(key string, now time.Time) *memHash {
	h := m.hashes[key]
	if h != nil && !h.expireAt.IsZero() && !now.Before(h.expireAt) {
		m.fields -= len(h.fields)
		delete(m.hashes, key)
		return nil
	}
	return h
}

// HIncrBy adds n to field of hash key, creating it. It reports false when
// the field was new and the bound was reached (the write is dropped).
func (m *Memory) HIncrBy(key, field string, n uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.live(key, m.now())
	if h == nil {
		h = &memHash{fields: map[string]uint64{}}
		m.hashes[key] = h
	}
	if _, ok := h.fields[field]; !ok {
		max := m.MaxFields
		if max == 0 {
			max = DefaultMemoryMaxFields
		}
		if m.fields >= max {
			// Reclaim expired hashes before refusing (only at the bound).
			now := m.now()
			for k := range m.hashes {
				m.live(k, now)
			}
		}
		if m.fields >= max {
			m.dropped++
			return false
		}
		m.fields++
	}
	h.fields[field] += n
	return true
}

// Dropped is the number of writes refused at the MaxFields bound.
func (m *Memory) Dropped() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dropped
}

// Apply implements Sink.
func (m *Memory) Apply(_ context.Context, b Batch) error {
	for _, hm := range []map[string]map[string]uint64{b.Usage, b.Denials} {
		for k, fs := range hm {
			for f, n := range fs {
				m.HIncrBy(k, f, n)
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for k, t := range b.Expire {
		if h := m.live(k, now); h != nil {
			h.expireAt = t
		}
	}
	// Expired hashes go when the flush runs, so memory stays bounded by the
	// retention without a janitor of its own.
	for k := range m.hashes {
		m.live(k, now)
	}
	return nil
}

// Keys implements Reader.
func (m *Memory) Keys(_ context.Context, windows []Window) ([]Key, error) {
	want := newWindowSet(windows)
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	found := map[Key]bool{}
	for k := range m.hashes {
		if m.live(k, now) == nil {
			continue
		}
		r, w, _, err := ParseKey(m.prefix, k)
		if err == nil && want.has(w) {
			found[Key{r, w}] = true
		}
	}
	return sortKeys(found), nil
}

// Read implements Reader.
func (m *Memory) Read(_ context.Context, rule RuleID, w Window) (Data, error) {
	d := Data{Rule: rule, Window: w, Usage: map[string]uint64{}}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if h := m.live(WindowUsageKey(m.prefix, rule, w), now); h != nil {
		for f, v := range h.fields {
			d.Usage[f] = v
		}
	}
	if h := m.live(WindowStatsKey(m.prefix, rule, w), now); h != nil {
		for f, v := range h.fields {
			addStatsField(&d, f, v)
		}
	}
	return d, nil
}

// TTL returns a hash's expiry (zero when it has none or does not exist), for tests.
func (m *Memory) TTL(key string) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h := m.live(key, m.now()); h != nil {
		return h.expireAt
	}
	return time.Time{}
}

// ExportHashes calls fn for every live hash (the embedded store's snapshot,
// memory.HashStore); fields must not be kept after fn returns.
func (m *Memory) ExportHashes(fn func(key string, expireAt time.Time, fields map[string]uint64)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for k := range m.hashes {
		if h := m.live(k, now); h != nil {
			fn(k, h.expireAt, h.fields)
		}
	}
}

// RestoreHash adds fields to hash key (within MaxFields) and sets its expiry
// when given (memory.HashStore, at start from a snapshot).
func (m *Memory) RestoreHash(key string, expireAt time.Time, fields map[string]uint64) {
	for f, v := range fields {
		m.HIncrBy(key, f, v)
	}
	if expireAt.IsZero() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if h := m.live(key, m.now()); h != nil {
		h.expireAt = expireAt
	}
}
