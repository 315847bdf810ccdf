package valkey

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// What became of a write: the one place a failed call, op or ledger write
// turns into a tally class (store.Tally) and, where it may still be
// applied, into the outage buffer.

// outcome is what a failed write may have done.
type outcome int

const (
	maybeApplied outcome = iota // sent, no answer
	notApplied                  // certainly not applied
	permanent                   // answered with an error that retrying will not fix
)

// classify tells whether a failed write may have been applied.
func classify(err error) outcome {
	if err == nil {
		return maybeApplied
	}
	if ve, ok := valkey.IsValkeyErr(err); ok {
		msg := ve.Error()
		switch {
		case malformed(msg):
			return permanent
		case ranScript(msg) && !refusedFirstWrite(msg):
			// Valkey does not undo a script that fails midway: what it
			// wrote before the error stays (its SETBIT, maybe INCRBYs).
			return maybeApplied
		}
		return notApplied // refused before it wrote: the command did nothing
	}
	var se *setupError
	if errors.As(err, &se) {
		return notApplied
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return notApplied
	}
	return maybeApplied
}

// ranScript reports whether an error reply was raised inside a running
// script: Valkey ends those with "script: <sha>, on @user_script:<line>."
// (older servers put "@user_script" in them too), while errors that refuse
// the call before it runs (NOSCRIPT, BUSY, LOADING, TRYAGAIN, MOVED, NOPERM
// on EVALSHA itself) do not. Seen on valkey-server 8.0:
//
//	ERR user_script:67: bad argument #2 to 'sunpack' (data string too short) script: <sha>, on @user_script:67.
//	ERR ACL failure in script: User budget has no permissions to run the 'hdel' command script: <sha>, on @user_script:1.
func ranScript(msg string) bool { return strings.Contains(msg, "user_script") }

// refusedFirstWrite reports whether a script's error is one Valkey raises
// only at the script's first write, so nothing was written: a replica
// (READONLY), a failed persistence (MISCONF), too few replicas (NOREPLICAS)
// and maxmemory (OOM) are checked at a write command only while the script
// has not written yet (Valkey's script call path, src/script.c in 8.0:
// "If the script already made a modification to the dataset, we can't fail
// it on unpredictable error state"). The charge script's first write is its
// SETBIT.
func refusedFirstWrite(msg string) bool {
	for _, p := range [...]string{"OOM ", "READONLY ", "MISCONF ", "NOREPLICAS "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func malformed(msg string) bool {
	return strings.HasPrefix(msg, "WRONGTYPE") || strings.Contains(msg, "not an integer") || strings.Contains(msg, "overflow")
}

// countWrite counts a counter's units (hits, its release, its ledger
// increment) in class c.
func (s *Store) countWrite(k *store.Counter, c store.Class) {
	s.tally.Add(store.TargetCounter, c, k.Hits)
	s.tally.Add(store.TargetRelease, c, k.Hold.Release)
	if k.Hits > 0 && k.Ledger.Key != "" {
		s.tally.Add(store.TargetLedger, c, k.Hits)
	}
}

// countOp counts an op's hits and releases in class c.
func (s *Store) countOp(o *op, c store.Class) {
	if o.flags&flagHash != 0 {
		s.tally.Add(store.TargetLedger, c, o.hits)
		return
	}
	s.tally.Add(store.TargetCounter, c, o.hits)
	s.tally.Add(store.TargetRelease, c, o.releases)
}

// pending is the op's write as the buffer keeps it; now is when the op was
// sent, for a call's own op (a buffered one carries its releaseBy).
func (o *op) pending(now time.Time) pending {
	p := pending{hits: o.hits, releases: o.releases, holdExpiry: time.Duration(o.period) * 2 * time.Millisecond, holdHash: o.holdHash, exp: time.UnixMilli(o.exp), owner: o.owner}
	if o.releases > 0 {
		p.releaseBy = time.UnixMilli(o.releaseDeadline(now))
	}
	return p
}

// target is the buffer entry an op's write is summed into.
func (o *op) target() target {
	if o.flags&flagHash != 0 {
		return target{key: o.key, field: o.field, hash: true}
	}
	return counterTarget(o.key)
}

// notSent buffers the writes of a call that certainly did not reach Valkey.
func (s *Store) notSent(counters []store.Counter) {
	for i := range counters {
		k := &counters[i]
		if k.Hits > 0 || k.Hold.Release > 0 {
			p := pending{hits: k.Hits, releases: k.Hold.Release, holdExpiry: k.Hold.Expiry, exp: k.ExpireAt}
			if k.Hold.Release > 0 {
				// The holds were placed before this charge: a hold's life
				// from now, they have certainly expired.
				p.holdHash = s.keys.holdHash(k.Key, k.Hold.Window, s.ids.tags)
				p.releaseBy = s.now().Add(k.Hold.Expiry)
				p.owner = k.Hold.Owner
			}
			s.buffer(counterTarget(k.Key), p, store.Buffered, store.Lost)
		}
		if k.Hits > 0 && k.Ledger.Key != "" {
			s.buffer(ledgerTarget(k.Ledger), pending{hits: k.Hits, exp: k.ExpireAt}, store.Buffered, store.Lost)
		}
	}
}

func counterTarget(key string) target      { return target{key: key} }
func ledgerTarget(h store.HashIncr) target { return target{key: h.Key, field: h.Field, hash: true} }

func (t target) tallied() store.Target {
	if t.hash {
		return store.TargetLedger
	}
	return store.TargetCounter
}

// buffer sums a write into the outage buffer, counted in class in, or in
// class full when there is no room. A ledger field's replay deadline is its
// counter's expiry: the ledger Recorder re-sends the hash's expiry at every
// flush, so a replayed hash gets it the way a normal one does.
func (s *Store) buffer(t target, w pending, in, full store.Class) {
	c, hits, releases := in, w.hits, w.releases
	if s.buf == nil || !s.buf.add(t, w) {
		c = full
	}
	s.tally.Add(t.tallied(), c, hits)
	if !t.hash {
		s.tally.Add(store.TargetRelease, c, releases)
	}
	switch {
	case c == full && hits > 0 && t.hash:
		s.logs.ledgerLoss(s.log, "outage buffer full or disabled", s.Stats())
	case c == full && hits > 0:
		s.logs.loss(s.log, "outage buffer full or disabled", s.Stats())
	case c == store.Buffered && hits > 0 && every(&s.logs.buffered, time.Second):
		s.log.Warn("valkey store: valkey unreachable, writes buffered for replay",
			"buffered_hits_total", s.tally.Get(store.TargetCounter, store.Buffered), "buffer_keys", s.buf.size.Load())
	}
}

// groupFailed settles a call's own script group, sent at now, that failed
// as out says.
func (s *Store) groupFailed(g *group, out outcome, now time.Time) {
	switch out {
	case notApplied:
		for i := range g.ops {
			o := &g.ops[i]
			if o.hits > 0 || o.releases > 0 {
				s.buffer(o.target(), o.pending(now), store.Buffered, store.Lost)
			}
		}
	case maybeApplied:
		if !g.writes() {
			return // reads and holds only: nothing to replay
		}
		for i := range g.ops {
			s.countOp(&g.ops[i], store.Ambiguous)
		}
		r := g.replay(now)
		r.unanswered = true
		s.keep(r, store.AmbiguousDropped)
		if every(&s.logs.ambiguous, time.Second) {
			s.log.Warn("valkey store: writes sent but unanswered; kept under their call's id and replayed exactly once",
				"ambiguous_hits_total", s.tally.Get(store.TargetCounter, store.Ambiguous))
		}
	case permanent:
		for i := range g.ops {
			s.countOp(&g.ops[i], store.Lost)
		}
		s.logs.loss(s.log, "valkey refused the charge script", s.Stats())
	}
}

// keep puts a group in the buffer under its id, or settles it in class
// dropped when there is no room.
func (s *Store) keep(g *group, dropped store.Class) {
	if s.buf != nil && s.buf.addGroup(g) {
		return
	}
	s.resolveGroup(g, store.BufferLost, dropped)
}

// resolve counts a buffered entry's units in a resolution class.
func (s *Store) resolve(t target, hits, releases uint64, c store.Class) {
	s.tally.Add(t.tallied(), c, hits)
	if !t.hash {
		s.tally.Add(store.TargetRelease, c, releases)
	}
}

// resolveGroup counts a kept group's units: in buffered when its ops came
// from the buffer, in ambiguous when they are a call's own.
func (s *Store) resolveGroup(g *group, buffered, ambiguous store.Class) {
	c := ambiguous
	if g.buffered {
		c = buffered
	}
	for i := range g.ops {
		s.countOp(&g.ops[i], c)
	}
}

// logLimits rate-limits the store's logs to one a second per kind.
type logLimits struct {
	lost, ambiguous, buffered, ledger atomic.Int64
}

func (l *logLimits) loss(log *slog.Logger, reason string, st Stats) {
	if every(&l.lost, time.Second) {
		log.Error("valkey store: charges lost", "reason", reason, "lost_hits_total", st.Lost, "buffer_keys", st.BufferKeys)
	}
}

func (l *logLimits) ledgerLoss(log *slog.Logger, reason string, st Stats) {
	if every(&l.ledger, time.Second) {
		log.Error("valkey store: ledger increments lost", "reason", reason, "lost_ledger_hits_total", st.LedgerLost, "buffer_keys", st.BufferKeys)
	}
}

// every reports whether at least d passed since the last time it said yes.
func every(last *atomic.Int64, d time.Duration) bool {
	now := time.Now().UnixNano()
	prev := last.Load()
	return now-prev >= int64(d) && last.CompareAndSwap(prev, now)
}

func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// counterValue parses an INCRBY or GET reply. A missing key (GET) is 0.
func counterValue(r valkey.ValkeyResult, get bool) (uint64, error) {
	v, err := r.AsInt64()
	if err != nil {
		if get && valkey.IsValkeyNil(err) {
			return 0, nil
		}
		return 0, wrapErr(err)
	}
	if v < 0 {
		return 0, fmt.Errorf("%w: negative counter %d", store.ErrMalformedReply, v)
	}
	return uint64(v), nil
}

// wrapErr maps a valkey-go error to the store's sentinels: a reply that is
// not a counter is ErrMalformedReply, anything else ErrUnavailable.
func wrapErr(err error) error {
	if ve, ok := valkey.IsValkeyErr(err); ok {
		if strings.Contains(ve.Error(), "overflow") {
			return fmt.Errorf("%w: %s", store.ErrOverflow, ve.Error())
		}
		if malformed(ve.Error()) {
			return fmt.Errorf("%w: %s", store.ErrMalformedReply, ve.Error())
		}
		return fmt.Errorf("%w: %s", store.ErrUnavailable, ve.Error())
	}
	var ne *strconv.NumError
	if valkey.IsParseErr(err) || errors.As(err, &ne) {
		return fmt.Errorf("%w: %w", store.ErrMalformedReply, err)
	}
	return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
}
