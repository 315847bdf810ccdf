package valkey

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// collect reads a call's replies into its results and settles what became of
// each write: applied (counted in c.applied), or handed to outcome.go
// (buffered, kept under its id, lost). It returns the call's first error.
func (s *Store) collect(c *call, res []valkey.ValkeyResult) error {
	if len(res) != len(c.cmds) {
		// Not a valkey-go reply shape: every command was handed to the
		// client, so any may have been applied; none is known.
		for _, g := range c.groups {
			s.groupFailed(g, maybeApplied, c.now)
		}
		return fmt.Errorf("%w: %d replies for %d commands", store.ErrMalformedReply, len(res), len(c.cmds))
	}
	var first error
	for gi, g := range c.groups {
		first = cmp(first, s.collectGroup(c, g, res[gi]))
	}
	j := len(c.groups)
	for _, i := range c.gets {
		v, err := counterValue(res[j], true)
		j++
		if err != nil {
			first = cmp(first, fmt.Errorf("read counter %d: %w", i, err))
			continue
		}
		c.results[i] = store.Result{Total: v}
	}
	return first
}

// collectGroup reads one script reply into the results of its ops.
func (s *Store) collectGroup(c *call, g *group, r valkey.ValkeyResult) error {
	if cap(c.replies) < len(g.ops) {
		c.replies = make([]opResult, len(g.ops))
	}
	reps := c.replies[:len(g.ops)]
	if _, err := parseReply(r, g.ops, reps); err != nil {
		out := classify(r.Error())
		if r.Error() == nil {
			// The script ran but its answer is not ours: maybe applied, and
			// a replay would find its id.
			out = maybeApplied
		}
		s.groupFailed(g, out, c.now)
		if !errors.Is(err, store.ErrMalformedReply) {
			err = wrapErr(err)
		}
		return fmt.Errorf("charge %d counters: %w", len(g.ops), err)
	}
	if g.hasID {
		g.id.expiryDone(c.now)
	}
	var first error
	for oi := range g.ops {
		o, rep := &g.ops[oi], &reps[oi]
		if o.flags&flagHash != 0 {
			// A measurement: its failure never fails the charge.
			if rep.err != nil {
				s.countOp(o, store.Lost)
				s.logs.ledgerLoss(s.log, "the ledger key holds something that is not a hash of integers", s.Stats())
			} else {
				c.applied[2] += o.hits
			}
			continue
		}
		if rep.err != nil {
			// The key holds something that is not a counter: this op did
			// nothing, the others of the script applied.
			s.countOp(o, store.Lost)
			s.logs.loss(s.log, "the key holds something that is not a counter", s.Stats())
			verb := "charge"
			if o.hits == 0 {
				verb = "read"
			}
			first = cmp(first, fmt.Errorf("%s counter %d: %w", verb, o.ci, rep.err))
			continue
		}
		c.applied[0] += o.hits
		c.applied[1] += o.releases
		c.results[o.ci] = rep.Result
	}
	return first
}

// withdraw keeps a request's holds all or none across slots (a cluster):
// where another slot's part of a request was over an enforcing limit, the
// holds placed for it in other slots are withdrawn in a second round trip.
// Off a cluster a request is one script, which decided that already.
func (s *Store) withdraw(ctx context.Context, c *call) error {
	if len(c.groups) < 2 {
		return nil
	}
	var holds []withdrawal
	start := 0
	for i := range c.counters {
		if i > 0 && c.counters[i].Start {
			holds = s.withdrawRequest(c, start, i, holds)
			start = i
		}
	}
	holds = s.withdrawRequest(c, start, len(c.counters), holds)
	var first error
	for _, w := range holds {
		// One script per hold: each hash may be in its own slot.
		tokens := strconv.FormatUint(c.counters[w.ci].Hold.Reserve, 10)
		cmd := s.b.Arbitrary("EVAL").Args(unholdScript, "1").Keys(w.hash).Args(w.field, tokens).Build()
		if err := s.client.DoMulti(ctx, cmd)[0].Error(); err != nil {
			// The hold stays until it expires: the budget is held a little
			// longer, never overspent.
			first = cmp(first, fmt.Errorf("withdraw a hold of counter %d: %w", w.ci, wrapErr(err)))
			continue
		}
		r := &c.results[w.ci]
		r.Reserved -= min(r.Reserved, c.counters[w.ci].Hold.Reserve)
		r.Held = false
	}
	if first != nil {
		s.log.Warn("valkey store: a denied request's hold could not be withdrawn; it expires on its own", "err", first)
	}
	return nil
}

// withdrawal is a hold to withdraw: its hash, its field (the counter's key)
// and the counter's index in the call.
type withdrawal struct {
	hash, field string
	ci          int
}

// withdrawRequest adds the holds of counters [from, to) to holds if the
// request is denied.
func (s *Store) withdrawRequest(c *call, from, to int, holds []withdrawal) []withdrawal {
	denied, held := false, false
	for i := from; i < to; i++ {
		k, r := &c.counters[i], &c.results[i]
		if c.pos[i] < 0 {
			continue
		}
		held = held || r.Held
		switch {
		case !k.Enforce:
		case k.Hold.Reserve > 0 && k.Hits == 0:
			denied = denied || (!r.Held && r.Total+r.Reserved >= k.Limit)
		default:
			denied = denied || r.Total > k.Limit
		}
	}
	if !denied || !held {
		return holds
	}
	for i := from; i < to; i++ {
		if c.pos[i] < 0 || !c.results[i].Held {
			continue
		}
		o := &c.groups[c.pos[i]>>16].ops[c.pos[i]&0xffff]
		holds = append(holds, withdrawal{hash: o.holdHash, field: o.key, ci: i})
	}
	return holds
}
