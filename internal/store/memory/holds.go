package memory

import (
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
)

// DefaultMaxHolds bounds the holds one counter keeps: a request that would
// need more is over its limit (as in the Valkey store).
const DefaultMaxHolds = 65536

// holds are a counter's reservations in two generations of Expiry/2 each
// (store.Hold): the current one, which new holds join, and the older one,
// which releases take from first and which expires when the clock enters
// the next generation.
type holds struct {
	end    int64  // when the current generation ends (Unix ns)
	p      int64  // the period the holds were placed with (ns)
	c1, t1 uint64 // current generation: holds and tokens
	c0, t0 uint64 // older generation
}

// period is a generation's length for holds living at most expiry.
func period(expiry time.Duration) int64 { return max(int64(expiry/2), 1) }

// at brings h to now, returning the tokens of holds that expired: at the
// current generation's end the older one expires and the current one ages;
// a period later, both.
func (h *holds) at(now, p int64) (expired uint64) {
	switch {
	case now >= h.end+h.p:
		expired = h.t0 + h.t1
		*h = holds{end: now + p}
	case now >= h.end:
		expired = h.t0
		h.c0, h.t0, h.c1, h.t1, h.end = h.c1, h.t1, 0, 0, h.end+p
	}
	h.p = p // a changed expiry applies from the next generation
	return expired
}

// release releases up to n holds, older generation first.
func (h *holds) release(n uint64) {
	for ; n > 0; n-- {
		switch {
		case h.c0 > 0:
			h.c0, h.t0 = releaseOne(h.c0, h.t0)
		case h.c1 > 0:
			h.c1, h.t1 = releaseOne(h.c1, h.t1)
		default:
			return // never below zero
		}
	}
}

// releaseOne takes one hold out of count holds of tokens: its share (the
// last one takes what is left, so a generation's tokens all go).
func releaseOne(count, tokens uint64) (uint64, uint64) {
	if count == 1 {
		return 0, 0
	}
	return count - 1, tokens - tokens/count
}

func (h *holds) reserved() uint64 { return h.t0 + h.t1 }
func (h *holds) live() uint64     { return h.c0 + h.c1 }

// touch brings c's holds to now, releases what the counter asks and writes
// the outcome into r.
func touch(h *holds, now int64, c *store.Counter, r *store.Result) *holds {
	if h == nil {
		if c.Hold.Reserve == 0 {
			return nil // nothing held, nothing to release
		}
		h = &holds{end: now + period(c.Hold.Expiry), p: period(c.Hold.Expiry)}
	}
	r.Expired = h.at(now, period(c.Hold.Expiry))
	h.release(c.Hold.Release)
	r.Reserved = h.reserved()
	return h
}
