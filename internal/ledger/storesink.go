package ledger

import (
	"context"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
)

// NewStoreSink returns a Sink that writes through the counter store
// (store.HashWriter), so the ledger's flushes share the store's in-flight
// bound and stall guard instead of going around them. Writes are in a
// deterministic order: usage, denials, then expiries, each sorted by key.
func NewStoreSink(w store.HashWriter) Sink { return storeSink{w} }

type storeSink struct{ w store.HashWriter }

func (s storeSink) Apply(ctx context.Context, b Batch) error {
	return s.w.WriteHashes(ctx, toHashWrites(b))
}

func toHashWrites(b Batch) store.HashWrites {
	var w store.HashWrites
	for _, m := range []map[string]map[string]uint64{b.Usage, b.Denials} {
		for _, k := range sortedKeys(m) {
			fs := m[k]
			for _, f := range sortedKeys(fs) {
				w.Incr = append(w.Incr, store.HashIncrBy{HashIncr: store.HashIncr{Key: k, Field: f}, N: fs[f]})
			}
		}
	}
	for _, k := range sortedKeys(b.Expire) {
		w.Expire = append(w.Expire, store.HashExpire{Key: k, At: b.Expire[k]})
	}
	return w
}

// WriteHashes implements store.HashWriter, so the memory store hands the
// ledger's flushes to the ledger it serves.
func (m *Memory) WriteHashes(ctx context.Context, w store.HashWrites) error {
	b := Batch{Usage: map[string]map[string]uint64{}, Expire: make(map[string]time.Time, len(w.Expire))}
	for _, h := range w.Incr {
		fs := b.Usage[h.Key]
		if fs == nil {
			fs = map[string]uint64{}
			b.Usage[h.Key] = fs
		}
		fs[h.Field] += h.N
	}
	for _, e := range w.Expire {
		b.Expire[e.Key] = e.At
	}
	return m.Apply(ctx, b)
}
