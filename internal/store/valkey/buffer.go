package valkey

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
)

// buffer holds writes that certainly did not reach Valkey, summed per
// target, with their absolute replay deadline: counter adds (per key) and the
// shadow-week ledger's hash-field adds (per hash and field, store.Counter.Ledger).
// Bounded in entries: a counter key and a ledger field each count as one.
type buffer struct {
	mu sync.Mutex
	m  map[target]pending
	// batches are ambiguous calls kept whole with their id (idempotent
	// charges only), replayed with the same id; each key counts as an entry.
	batches   []*batch
	batchKeys int
	max       int
	size      atomic.Int64
}

// target is a counter key (field empty, hash false) or a ledger hash field.
type target struct {
	key, field string
	hash       bool
}

type pending struct {
	hits uint64
	exp  time.Time
}

type entry struct {
	target
	pending
}

func newBuffer(max int) *buffer { return &buffer{m: make(map[target]pending), max: max} }

// add sums hits into t's entry; false when the buffer is full (the caller
// counts the loss). hits == 0 on a counter records only that its expiry must
// be set. exp is the counter's expiry, or the replay deadline of a ledger
// field.
func (b *buffer) add(t target, hits uint64, exp time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.m[t]; ok {
		if p.hits > math.MaxInt64-hits {
			return false
		}
		p.hits += hits
		b.m[t] = p
		return true
	}
	if len(b.m)+b.batchKeys >= b.max {
		return false
	}
	b.m[t] = pending{hits: hits, exp: exp}
	b.size.Store(int64(len(b.m) + b.batchKeys))
	return true
}

// addBatch keeps an ambiguous call whole, with its id; false when full.
func (b *buffer) addBatch(x *batch) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.m)+b.batchKeys+len(x.keys) > b.max {
		return false
	}
	b.batches = append(b.batches, x)
	b.batchKeys += len(x.keys)
	b.size.Store(int64(len(b.m) + b.batchKeys))
	return true
}

// takeBatches removes up to n ambiguous calls, oldest first.
func (b *buffer) takeBatches(n int) []*batch {
	b.mu.Lock()
	defer b.mu.Unlock()
	n = min(n, len(b.batches))
	out := append([]*batch(nil), b.batches[:n]...)
	clear(b.batches[:n])
	b.batches = b.batches[n:]
	for _, x := range out {
		b.batchKeys -= len(x.keys)
	}
	b.size.Store(int64(len(b.m) + b.batchKeys))
	return out
}

// take removes up to n entries.
func (b *buffer) take(n int) []entry {
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
	b.size.Store(int64(len(b.m) + b.batchKeys))
	return out
}

// drain empties the buffer and returns what it held: counter hits, ledger
// hits, hits of ambiguous calls, and entries.
func (b *buffer) drain() (hits, ledgerHits, ambiguousHits uint64, entries int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for t, p := range b.m {
		if t.hash {
			ledgerHits += p.hits
		} else {
			hits += p.hits
		}
	}
	for _, x := range b.batches {
		ambiguousHits += x.total()
	}
	entries = len(b.m) + b.batchKeys
	clear(b.m)
	b.batches, b.batchKeys = nil, 0
	b.size.Store(0)
	return hits, ledgerHits, ambiguousHits, entries
}

const replayBatch = 256

// replayer retries the buffer every ReplayInterval until Close.
func (s *Store) replayer() {
	defer s.wg.Done()
	t := time.NewTicker(s.replayEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		for s.buf.size.Load() > 0 {
			select {
			case <-s.stop:
				return
			default:
			}
			if !s.replayOnce() {
				break
			}
		}
	}
}

// replayOnce replays one batch; false when Valkey is not answering or the
// batch did not fully succeed (try again next tick).
func (s *Store) replayOnce() bool {
	select {
	case s.sem <- struct{}{}: // stay within the in-flight cap
	default:
		return false
	}
	defer func() { <-s.sem }()
	if !s.ready.Load() || !s.probe() {
		return false
	}
	if s.idem != nil {
		return s.replayIdempotent()
	}
	batch := s.buf.take(replayBatch)
	if len(batch) == 0 {
		return true
	}
	now := s.now()
	cmds := make([]valkey.Completed, 0, 2*len(batch))
	live := batch[:0]
	for _, e := range batch {
		if !e.exp.After(now) {
			// The window is over: the counter is gone in Valkey too (and
			// the ledger's Recorder may no longer set the hash's expiry).
			s.expire(e)
			continue
		}
		switch {
		case e.hash:
			// The hash's expiry comes from the ledger Recorder's periodic
			// EXPIREAT, as on the normal path; the deadline keeps the
			// replay within the days it still covers.
			cmds = append(cmds, s.cmd.hincrby(e.key, e.field, e.hits))
		case e.hits > 0:
			cmds = append(cmds, s.cmd.incrby(e.key, e.hits), s.cmd.pexpireatNX(e.key, s.msString(e.exp)))
		default:
			cmds = append(cmds, s.cmd.pexpireatNX(e.key, s.msString(e.exp)))
		}
		live = append(live, e)
	}
	if len(cmds) == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.detach)
	res := s.client.DoMulti(ctx, cmds...)
	cancel()
	if len(res) != len(cmds) {
		// Not a valkey-go reply shape: nothing is known to be applied.
		for _, e := range live {
			s.ambiguousEntry(e)
		}
		return false
	}
	ok := true
	var hits, ledgerHits uint64
	j := 0
	for _, e := range live {
		if e.hash {
			r := res[j]
			j++
			if err := r.Error(); err != nil {
				ok = false
				s.ledgerFailed(e.target, e.hits, e.exp, err)
				continue
			}
			ledgerHits += e.hits
			s.ledgerReplayed.Add(e.hits)
			continue
		}
		if e.hits > 0 {
			r := res[j]
			j++
			if err := r.Error(); err != nil {
				ok = false
				switch classify(err) {
				case notApplied:
					if !s.buf.add(e.target, e.hits, e.exp) {
						s.loss(e.hits, "outage buffer full")
					}
				case maybeApplied:
					s.maybeSent(e.hits)
				case permanent:
					s.loss(e.hits, "the key holds something that is not a counter")
				}
				j++ // its expiry reply
				continue
			}
			hits += e.hits
			s.replayed.Add(e.hits)
		}
		if err := res[j].Error(); err != nil {
			ok = false
			// PEXPIREAT NX is idempotent: always safe to send again.
			s.buf.add(e.target, 0, e.exp)
		}
		j++
	}
	if hits > 0 || ledgerHits > 0 {
		s.log.Info("valkey store: replayed buffered charges", "hits", hits, "ledger_hits", ledgerHits, "entries", len(live), "buffer_entries", s.buf.size.Load())
	}
	return ok
}

// probe pings Valkey, so a batch is only sent to a server that answers: a
// batch sent into a stall would become ambiguous.
func (s *Store) probe() bool {
	pctx, pcancel := context.WithTimeout(context.Background(), s.probeTimeout())
	pong := s.client.DoMulti(pctx, s.b.Ping().Build())
	pcancel()
	return len(pong) == 1 && pong[0].Error() == nil
}

// expire drops a buffered entry whose deadline passed (counted, logged).
func (s *Store) expire(e entry) {
	if e.hits == 0 {
		return
	}
	if e.hash {
		total := s.ledgerExpired.Add(e.hits)
		s.log.Warn("valkey store: buffered ledger increments expired before Valkey came back", "expired_ledger_hits_total", total)
		return
	}
	total := s.expired.Add(e.hits)
	s.log.Warn("valkey store: buffered charges expired before Valkey came back", "expired_hits_total", total)
}

func (s *Store) ambiguousEntry(e entry) {
	if e.hash {
		s.ledgerMaybeSent(e.hits)
		return
	}
	s.maybeSent(e.hits)
}

func (s *Store) probeTimeout() time.Duration { return s.connWrite }
