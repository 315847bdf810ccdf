package store

import "sync/atomic"

// Hit accounting: the one vocabulary every store uses to say what became of
// the hits it was handed. A hit is one unit a Counter adds (a token, or a
// request); a release is one hold a charge gives back (Hold.Release). Every
// hit and release a store is handed ends in exactly one outcome class
// (Applied, AppliedOnError, NotSent, Lost) or waits (Buffered, Ambiguous)
// until exactly one resolution class settles it (Replayed, Expired,
// BufferLost; AmbiguousApplied, AmbiguousReplayed, AmbiguousDropped), for
// every target alike: a counter's hits, the holds its charges release, and
// the shadow-week ledger's increments (Counter.Ledger).

// Target is what a tallied unit was for.
type Target uint8

// Targets.
const (
	// TargetCounter: hits of a counter.
	TargetCounter Target = iota
	// TargetLedger: the same hits' ledger increment (Counter.Ledger).
	TargetLedger
	// TargetRelease: holds a charge releases (Hold.Release), one each.
	TargetRelease
	numTargets
)

var targetNames = [numTargets]string{"counter", "ledger", "release"}

func (t Target) String() string { return targetNames[t] }

// Class is what became of tallied units.
type Class uint8

// Outcome classes: a unit handed to the store gets exactly one of these.
const (
	// Applied: the store applied it and said so.
	Applied Class = iota
	// AppliedOnError: applied, though the call returned an error to its
	// caller (it gave up at its deadline, or another part failed).
	AppliedOnError
	// NotSent: not applied and handed back to the caller (ErrNotSent): its
	// deadline had passed when it reached the store. The charger hands it
	// back through Deferrer, where it is a new unit.
	NotSent
	// Buffered: certainly not applied; waiting in the outage buffer.
	Buffered
	// Ambiguous: sent and not answered, so maybe applied; waiting in the
	// outage buffer under its call's id, replayed exactly once.
	Ambiguous
	// Lost: certainly not applied and nowhere to keep it (buffer full or
	// disabled, store closed, the key holds something that is not a counter).
	Lost

	// Resolution classes: a Buffered unit ends in exactly one of the first
	// three, an Ambiguous one in exactly one of the last three.

	// Replayed: buffered, then applied.
	Replayed
	// Expired: buffered, dropped because its window ended first.
	Expired
	// BufferLost: buffered, then dropped (no room to keep it, store closed).
	BufferLost
	// AmbiguousApplied: the replay found the first send applied.
	AmbiguousApplied
	// AmbiguousReplayed: the first send was not applied; the replay was.
	AmbiguousReplayed
	// AmbiguousDropped: given up, maybe applied (its id window passed, no
	// room to keep it, store closed).
	AmbiguousDropped
	numClasses
)

var classNames = [numClasses]string{"applied", "applied_on_error", "not_sent", "buffered", "ambiguous", "lost",
	"replayed", "expired", "buffer_lost", "ambiguous_applied", "ambiguous_replayed", "ambiguous_dropped"}

func (c Class) String() string { return classNames[c] }

// Classes lists every class, in order.
func Classes() []Class {
	out := make([]Class, numClasses)
	for i := range out {
		out[i] = Class(i)
	}
	return out
}

// Targets lists every target, in order.
func Targets() []Target {
	out := make([]Target, numTargets)
	for i := range out {
		out[i] = Target(i)
	}
	return out
}

// Tally counts units per target and class. The zero value is ready; safe for
// concurrent use.
type Tally struct {
	n [numTargets][numClasses]atomic.Uint64
}

// Add counts n units of target t in class c.
func (y *Tally) Add(t Target, c Class, n uint64) {
	if n != 0 {
		y.n[t][c].Add(n)
	}
}

// Get returns the units of target t counted in class c.
func (y *Tally) Get(t Target, c Class) uint64 { return y.n[t][c].Load() }

// Handed returns the units of t handed to the store: the sum of the outcome
// classes.
func (y *Tally) Handed(t Target) uint64 {
	var n uint64
	for c := Applied; c <= Lost; c++ {
		n += y.Get(t, c)
	}
	return n
}

// Waiting returns the units of t still waiting: buffered or ambiguous, not
// yet resolved.
func (y *Tally) Waiting(t Target) int64 {
	buffered := int64(y.Get(t, Buffered)) - int64(y.Get(t, Replayed)+y.Get(t, Expired)+y.Get(t, BufferLost))
	return buffered + int64(y.Get(t, Ambiguous)) - int64(y.Get(t, AmbiguousApplied)+y.Get(t, AmbiguousReplayed)+y.Get(t, AmbiguousDropped))
}
