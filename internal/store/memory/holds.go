package memory

import "github.com/budgetgen/budgetgen/internal/store"

// DefaultMaxHolds bounds the holds one counter keeps: a request that would
// need more is over its limit (as in the Valkey store).
const DefaultMaxHolds = 65536

// hold is one admitted, unfinished request's reservation.
type hold struct {
	exp    int64 // Unix nanoseconds
	tokens uint64
}

// holdQ is a counter's holds, oldest first, and the tokens they hold.
type holdQ struct {
	q        []hold
	head     int
	reserved uint64
}

func (q *holdQ) len() int {
	if q == nil {
		return 0
	}
	return len(q.q) - q.head
}

// touch drops the expired holds at the head and releases the oldest
// release live ones, writing the outcome into r. It returns the queue (nil
// once empty, so idle counters keep no queue).
func (q *holdQ) touch(now int64, release uint64, r *store.Result) *holdQ {
	if q == nil {
		return nil
	}
	for q.head < len(q.q) {
		h := q.q[q.head]
		switch {
		case h.exp <= now:
			r.Expired += h.tokens
		case release > 0:
			release--
		default:
			r.Reserved = q.reserved
			return q.compact()
		}
		q.reserved -= min(q.reserved, h.tokens)
		q.q[q.head] = hold{}
		q.head++
	}
	r.Reserved = q.reserved
	return q.compact()
}

// push adds a hold at the tail.
func (q *holdQ) push(h hold) *holdQ {
	if q == nil {
		q = &holdQ{}
	}
	q.q = append(q.q, h)
	q.reserved += h.tokens
	return q
}

// compact frees the consumed head of the queue when it is most of it.
func (q *holdQ) compact() *holdQ {
	switch {
	case q.head == len(q.q):
		return nil
	case q.head > 32 && q.head > len(q.q)/2:
		q.q = append(q.q[:0], q.q[q.head:]...)
		q.head = 0
	}
	return q
}

// holds returns the live holds, oldest first (snapshots).
func (q *holdQ) holds() []hold {
	if q == nil {
		return nil
	}
	return q.q[q.head:]
}
