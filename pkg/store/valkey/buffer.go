package valkey

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
)

// buffer holds charges that certainly did not reach Valkey, summed per key,
// with their absolute expiry. Bounded in keys.
type buffer struct {
	mu   sync.Mutex
	m    map[string]pending
	max  int
	size atomic.Int64
}

type pending struct {
	hits uint64
	exp  time.Time
}

type entry struct {
	key string
	pending
}

func newBuffer(max int) *buffer { return &buffer{m: make(map[string]pending), max: max} }

// add sums hits into key's entry; false when the buffer is full (the caller
// counts the loss). hits == 0 records only that key's expiry must be set.
func (b *buffer) add(key string, hits uint64, exp time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.m[key]; ok {
		if p.hits > math.MaxInt64-hits {
			return false
		}
		p.hits += hits
		b.m[key] = p
		return true
	}
	if len(b.m) >= b.max {
		return false
	}
	b.m[key] = pending{hits: hits, exp: exp}
	b.size.Store(int64(len(b.m)))
	return true
}

// take removes up to n entries.
func (b *buffer) take(n int) []entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]entry, 0, min(n, len(b.m)))
	for k, p := range b.m {
		if len(out) == n {
			break
		}
		out = append(out, entry{key: k, pending: p})
		delete(b.m, k)
	}
	b.size.Store(int64(len(b.m)))
	return out
}

// drain empties the buffer and returns what it held.
func (b *buffer) drain() (hits uint64, keys int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.m {
		hits += p.hits
	}
	keys = len(b.m)
	clear(b.m)
	b.size.Store(0)
	return hits, keys
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
	// Probe first, so a batch is only sent to a server that answers: a batch
	// sent into a stall would become ambiguous.
	pctx, pcancel := context.WithTimeout(context.Background(), s.probeTimeout())
	pong := s.client.DoMulti(pctx, s.b.Ping().Build())
	pcancel()
	if len(pong) != 1 || pong[0].Error() != nil {
		return false
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
			// The window is over: the counter is gone in Valkey too.
			if e.hits > 0 {
				total := s.expired.Add(e.hits)
				s.log.Warn("valkey store: buffered charges expired before Valkey came back", "expired_hits_total", total)
			}
			continue
		}
		if e.hits > 0 {
			cmds = append(cmds, s.b.Incrby().Key(e.key).Increment(int64(e.hits)).Build())
		}
		cmds = append(cmds, s.b.Arbitrary("PEXPIREAT").Keys(e.key).Args(s.msString(e.exp), "NX").Build())
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
			s.maybeSent(e.hits)
		}
		return false
	}
	ok := true
	var hits uint64
	j := 0
	for _, e := range live {
		if e.hits > 0 {
			r := res[j]
			j++
			if err := r.Error(); err != nil {
				ok = false
				switch classify(err) {
				case notApplied:
					if !s.buf.add(e.key, e.hits, e.exp) {
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
			s.buf.add(e.key, 0, e.exp)
		}
		j++
	}
	if hits > 0 {
		s.log.Info("valkey store: replayed buffered charges", "hits", hits, "keys", len(live), "buffer_keys", s.buf.size.Load())
	}
	return ok
}

func (s *Store) probeTimeout() time.Duration { return s.connWrite }
