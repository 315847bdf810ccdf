package valkey

import (
	"context"
	"errors"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// replayIdempotent is replayOnce with idempotent charges: summed entries go
// through the charge script under fresh ids (so a replay that is itself
// ambiguous can be replayed again), ambiguous calls under their own id.
// Called with a slot held and after a successful probe.
func (s *Store) replayIdempotent() bool {
	entries := s.buf.take(replayBatch)
	olds := s.buf.takeBatches(replayBatch)
	if len(entries) == 0 && len(olds) == 0 {
		return true
	}
	now := s.now()
	var (
		cmds    []valkey.Completed
		plain   []entry  // ledger fields and expiry-only entries, one command each
		fresh   []*batch // summed entries under new ids
		replays []*batch // ambiguous calls under their ids
	)
	for _, e := range entries {
		switch {
		case !e.exp.After(now):
			s.expire(e)
		case e.hash || e.hits == 0:
			plain = append(plain, e)
		default:
			var sl uint16
			if s.idem.tags != nil {
				sl = keySlot(e.key)
			}
			var b *batch
			for _, x := range fresh {
				if x.slot == sl {
					b = x
					break
				}
			}
			if b == nil {
				b = s.idem.newBatch(sl, now)
				b.buffered = true
				fresh = append(fresh, b)
			}
			b.add(e.key, e.hits, e.exp.UnixMilli())
		}
	}
	for _, b := range olds {
		if now.Add(s.idem.margin).UnixMilli() >= b.idExp {
			// Its id may be gone from Valkey: a replay could count twice.
			s.ambiguousDrop(b.total(), "its id expired before Valkey answered")
			continue
		}
		replays = append(replays, b)
	}
	all := append(fresh, replays...)
	for _, b := range all {
		cmds = append(cmds, s.scriptCmd(b, false))
	}
	for _, e := range plain {
		if e.hash {
			cmds = append(cmds, s.cmd.hincrby(e.key, e.field, e.hits))
		} else {
			cmds = append(cmds, s.cmd.pexpireatNX(e.key, s.msString(e.exp)))
		}
	}
	if len(cmds) == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.detach)
	defer cancel()
	res := s.client.DoMulti(ctx, cmds...)
	if len(res) != len(cmds) {
		res = make([]valkey.ValkeyResult, len(cmds)) // nothing known: all ambiguous below
	}
	s.retryNoScript(ctx, all, res)
	ok := true
	var hits, ledgerHits uint64
	for bi, b := range all {
		isReplay := bi >= len(fresh) // sent before, under this id
		rep, err := parseScriptReply(res[bi], len(b.keys))
		if err != nil {
			ok = false
			out := classify(res[bi].Error())
			if res[bi].Error() == nil && !errors.Is(err, store.ErrMalformedReply) {
				out = maybeApplied
			}
			switch out {
			case notApplied:
				if isReplay {
					s.keepBatch(b)
				} else {
					for i, k := range b.keys {
						if !s.buf.add(target{key: k}, b.hits[i], time.UnixMilli(b.exps[i])) {
							s.loss(b.hits[i], "outage buffer full")
						}
					}
				}
			case maybeApplied:
				// Kept under its id; a buffered batch stays counted in
				// Buffered and resolves into Replayed.
				s.keepBatch(b)
			case permanent:
				if isReplay {
					s.ambiguousDrop(b.total(), "valkey refused the charge script")
				} else {
					s.loss(b.total(), "valkey refused the charge script")
				}
			}
			continue
		}
		for i, h := range b.hits {
			if rep.errs[i] != nil {
				if isReplay {
					s.ambiguousDrop(h, "the key holds something that is not a counter")
				} else { // sent once, refused: not applied
					s.loss(h, "the key holds something that is not a counter")
				}
				continue
			}
			hits += h
			switch {
			case b.buffered:
				s.replayed.Add(h) // by this send or an earlier ambiguous one
			case rep.fresh:
				s.ambiguousReplayed.Add(h) // the first send had not been applied
			default:
				s.ambiguousApplied.Add(h) // it had: counted once, by the first send
			}
		}
	}
	j := len(all)
	for _, e := range plain {
		err := res[j].Error()
		j++
		if e.hash {
			if err != nil {
				ok = false
				s.ledgerFailed(e.target, e.hits, e.exp, err)
				continue
			}
			ledgerHits += e.hits
			s.ledgerReplayed.Add(e.hits)
			continue
		}
		if err != nil {
			ok = false
			s.buf.add(e.target, 0, e.exp) // PEXPIREAT NX is idempotent
		}
	}
	if hits > 0 || ledgerHits > 0 {
		s.log.Info("valkey store: replayed buffered charges", "hits", hits, "ledger_hits", ledgerHits, "calls", len(all), "buffer_entries", s.buf.size.Load())
	}
	return ok
}

// retryNoScript re-sends as EVAL the script calls answered NOSCRIPT (Valkey
// restarted, failed over or flushed its script cache): an error reply, so
// nothing was applied. EVAL loads the script for the next EVALSHA.
func (s *Store) retryNoScript(ctx context.Context, bs []*batch, res []valkey.ValkeyResult) {
	var idx []int
	for i := range bs {
		if noScript(res[i]) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return
	}
	cmds := make([]valkey.Completed, len(idx))
	for n, i := range idx {
		cmds[n] = s.scriptCmd(bs[i], true)
	}
	again := s.client.DoMulti(ctx, cmds...)
	if len(again) != len(idx) {
		return
	}
	for n, i := range idx {
		res[i] = again[n]
	}
}

// keepBatch puts an ambiguous call back in the buffer with its id; beyond
// the bound it is dropped (maybe applied).
func (s *Store) keepBatch(b *batch) {
	if s.buf == nil || !s.buf.addBatch(b) {
		s.ambiguousDrop(b.total(), "outage buffer full or disabled")
	}
}

// ambiguousDrop counts ambiguous hits given up on: maybe applied, not
// replayed.
func (s *Store) ambiguousDrop(hits uint64, reason string) {
	if hits == 0 {
		return
	}
	total := s.ambiguousDropped.Add(hits)
	if every(&s.lastAmbLog, time.Second) {
		s.log.Warn("valkey store: ambiguous charges not replayed; maybe applied", "reason", reason, "ambiguous_dropped_hits_total", total)
	}
}
