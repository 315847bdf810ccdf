package valkey

import (
	"context"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// replayBatch is the most buffer entries (and kept groups) one replay sends.
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

// replay is one replay's worth of buffered writes: summed entries under
// fresh ids, then kept groups under theirs.
type replay struct {
	groups []*group
}

// replayOnce replays one batch; false when Valkey is not answering or the
// batch did not fully succeed (try again next tick). The summed entries go
// through the charge script under fresh ids (so a replay that is itself
// unanswered can be kept and replayed again), kept groups under their own.
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
	now := s.now()
	r := s.takeReplay(now)
	if len(r.groups) == 0 {
		return true
	}
	cmds := make([]valkey.Completed, 0, len(r.groups))
	for _, g := range r.groups {
		cmds = append(cmds, s.scriptCmd(g, false, now))
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.detach)
	defer cancel()
	res := s.do(ctx, cmds)
	if len(res) != len(cmds) {
		res = make([]valkey.ValkeyResult, len(cmds)) // nothing known: all maybe applied below
	} else {
		s.retryNoScript(ctx, r.groups, res, now)
		s.retryTryAgain(ctx, r.groups, res, now)
	}
	ok := true
	var hits, ledgerHits uint64
	for gi, g := range r.groups {
		n, ln, done := s.settleReplay(g, res[gi])
		hits += n
		ledgerHits += ln
		ok = ok && done
	}
	if hits > 0 || ledgerHits > 0 {
		s.log.Info("valkey store: replayed buffered charges", "hits", hits, "ledger_hits", ledgerHits, "calls", len(r.groups), "buffer_entries", s.buf.size.Load())
	}
	return ok
}

// takeReplay takes a batch from the buffer: expired entries are settled at
// once, counter entries summed into fresh groups (one per slot), kept groups
// whose id may be gone are dropped.
func (s *Store) takeReplay(now time.Time) replay {
	entries, kept := s.buf.take(replayBatch)
	var r replay
	fresh := map[uint16]*group{}
	var stale uint64
	for _, e := range entries {
		if e.releases > 0 && !now.Before(e.releaseBy) {
			stale += e.releases
			s.tally.Add(store.TargetRelease, store.Expired, e.releases)
			e.releases = 0
		}
		switch {
		case !e.exp.After(now):
			// The window is over: the counter is gone in Valkey too.
			s.resolve(e.target, e.hits, e.releases, store.Expired)
			if e.hits > 0 {
				s.log.Warn("valkey store: buffered writes expired before Valkey came back", "hits", e.hits, "ledger", e.hash)
			}
		case e.hits == 0 && e.releases == 0:
			// Only stale releases, counted above: nothing left to send.
		default:
			sl := s.slotOf(e.key)
			g := fresh[sl]
			if g == nil {
				g = &group{slot: sl, buffered: true}
				fresh[sl] = g
				r.groups = append(r.groups, g)
			}
			o := op{key: e.key, hits: e.hits, exp: e.exp.UnixMilli(), releases: e.releases, ci: -1}
			switch {
			case e.hash:
				o.flags, o.field = flagHash, e.field
			case e.releases > 0:
				// Every buffered release names its hold hash (op.pending,
				// notSent).
				o.flags, o.holdHash, o.period = flagHold, e.holdHash, max(e.holdExpiry.Milliseconds()/2, 1)
				o.releaseBy, o.owner = e.releaseBy.UnixMilli(), e.owner
			}
			g.ops = append(g.ops, o)
		}
	}
	for _, g := range r.groups {
		g.id, g.hasID = s.ids.next(g.slot, now), true
	}
	for _, g := range kept {
		stale += s.dropStaleReleases(g, now)
		if !s.ids.replayable(g.id, now) {
			// Its id may be gone from Valkey: a replay could count twice.
			s.resolveGroup(g, store.BufferLost, store.AmbiguousDropped)
			s.log.Warn("valkey store: an unanswered call was not replayed before its id expired; maybe applied", "hits", g.hits())
			continue
		}
		r.groups = append(r.groups, g)
	}
	if stale > 0 {
		s.log.Warn("valkey store: hold releases not replayed: their holds expired before Valkey came back", "releases", stale)
	}
	return r
}

// dropStaleReleases takes from a kept group the releases whose holds have
// certainly expired by now, counting them (Expired, or AmbiguousDropped for
// a call's own group: the first send may have applied them), and returns how
// many. A release takes the counter's oldest hold: replayed now, it would
// free the hold of a request admitted since. The group's id is unchanged: a
// first send that was applied still makes the replay write nothing.
func (s *Store) dropStaleReleases(g *group, now time.Time) uint64 {
	c := store.AmbiguousDropped
	if g.buffered {
		c = store.Expired
	}
	var n uint64
	ms := now.UnixMilli()
	for i := range g.ops {
		o := &g.ops[i]
		if o.releases > 0 && ms >= o.releaseBy {
			n += o.releases
			s.tally.Add(store.TargetRelease, c, o.releases)
			o.releases, o.flags = 0, o.flags&^flagHold
		}
	}
	return n
}

// settleReplay settles one replayed group from its reply: the counter and
// ledger hits it applied, and whether it is done (applied, or settled for
// good).
func (s *Store) settleReplay(g *group, r valkey.ValkeyResult) (uint64, uint64, bool) {
	reps := make([]opResult, len(g.ops))
	fresh, err := parseReply(r, g.ops, reps)
	if err != nil {
		out := classify(r.Error())
		if r.Error() == nil {
			out = maybeApplied
		}
		switch {
		case out == permanent:
			s.resolveGroup(g, store.BufferLost, store.AmbiguousDropped)
		case out == notApplied && !g.unanswered:
			// Never sent unanswered: certainly not applied, summed back.
			for i := range g.ops {
				o := &g.ops[i]
				if !s.buf.add(o.target(), o.pending(s.now())) {
					s.countOp(o, store.BufferLost)
				}
			}
		default:
			g.unanswered = g.unanswered || out == maybeApplied
			s.keep(g, store.AmbiguousDropped)
		}
		return 0, 0, false
	}
	if g.hasID {
		g.id.expiryDone(s.now())
	}
	class := store.AmbiguousApplied // the first send had applied it
	switch {
	case g.buffered:
		class = store.Replayed // by this send, or an earlier unanswered one
	case fresh:
		class = store.AmbiguousReplayed // the first send had not been applied
	}
	var hits, ledgerHits uint64
	for i := range g.ops {
		o := &g.ops[i]
		if reps[i].err != nil {
			s.resolveGroup(&group{ops: []op{*o}, buffered: g.buffered}, store.BufferLost, store.AmbiguousDropped)
			continue
		}
		s.countOp(o, class)
		if o.flags&flagHold != 0 && reps[i].Expired > 0 {
			// Found by this replay, not by a call anyone waits for.
			s.reportExpired(o.owner, reps[i].Expired)
		}
		if o.flags&flagHash != 0 {
			ledgerHits += o.hits
		} else {
			hits += o.hits
		}
	}
	return hits, ledgerHits, true
}

// ReportExpired implements store.ExpiryReporter: f gets the tokens of holds
// a replayed release found expired (settleReplay), with the counter's
// store.Hold.Owner. It is called on the replayer's goroutine.
func (s *Store) ReportExpired(f func(owner any, tokens uint64)) {
	if f == nil {
		s.onExpired.Store(nil)
		return
	}
	s.onExpired.Store(&f)
}

func (s *Store) reportExpired(owner any, tokens uint64) {
	if f := s.onExpired.Load(); f != nil {
		(*f)(owner, tokens)
	}
}

// probe pings Valkey, so a batch is only sent to a server that answers: a
// batch sent into a stall would become ambiguous.
func (s *Store) probe() bool {
	pctx, pcancel := context.WithTimeout(context.Background(), s.connWrite)
	pong := s.client.DoMulti(pctx, s.b.Ping().Build())
	pcancel()
	return len(pong) == 1 && pong[0].Error() == nil
}
