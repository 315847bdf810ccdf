// Package store defines the counter store the rate limit decision engine
// depends on, sized for one round trip per request. Implementations live in
// sub-packages (memory, valkey) and pass the same behaviour suite (storetest).
package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Counter is one fixed-window counter touched by a request.
type Counter struct {
	// Key is the fully encoded counter key. It already names the window, so a
	// new window is a new key. Two different descriptors never share a key.
	Key string
	// Hits is added to the counter. Zero means check only: the counter is read,
	// not written, and no key is created.
	Hits uint64
	// ExpireAt is the absolute expiry set when the counter is first written
	// (window end plus a grace period). It is never moved once set, so repeated
	// charges cannot keep a counter alive past its window.
	ExpireAt time.Time
	// Ledger, when its Key is set and Hits > 0, also adds Hits to field
	// Ledger.Field of hash Ledger.Key (the shadow-week ledger, internal/ledger) in
	// the same round trip. Its failure never fails the charge.
	Ledger HashIncr
	// Start marks the first counter of a request in a call that carries
	// several requests (the charger's batches); the first counter of a call
	// always starts one. A request's holds are placed all or none.
	Start bool
	// Limit and Enforce matter only in a request with a reserving check
	// (Hold.Reserve > 0): the store admits that request iff no counter with
	// Enforce is over its Limit (a reserving check is over when
	// total + reserved >= Limit, any other when total > Limit), and only
	// then places its holds.
	Limit   uint64
	Enforce bool
	// Hold makes the counter reservation-aware; the zero value is a plain
	// counter.
	Hold Hold
}

// Hold is the reservation part of a counter of a reserving budget: a check
// (Hits == 0) holds Reserve tokens for its admitted, unfinished request, and
// the request's charge (Hits > 0, Release 1) adds its real count and releases
// one hold.
//
// Holds are kept per counter in two generations of Expiry/2 each (a count
// and the tokens they hold): a hold joins the current generation; a release
// takes one from the older generation first (oldest first); when the clock
// enters a new generation the older one expires, its holds dropped and
// counted (Result.Expired), and the current one becomes the older. A hold
// whose charge never comes thus lasts between Expiry/2 and Expiry, for two
// commands per reserving op whatever the number of holds.
type Hold struct {
	// Reserve is what a check holds if its request is admitted (0: none).
	Reserve uint64
	// Release is how many of the counter's oldest holds the call releases
	// (a request's charge: 1; none left: nothing, never below zero).
	Release uint64
	// Expiry is the longest a hold lives without its charge; required with
	// Reserve or Release.
	Expiry time.Duration
	// Window is when the counter's window ends (unix seconds): a store may
	// keep the holds of a window's counters together (the Valkey store: one
	// hash per window, which goes with the window). Every call for one
	// counter must give the same Window; 0 when unknown (the Valkey store
	// then keeps them in one hash per slot that lives as long as its
	// longest counter).
	Window int64
	// Owner, optional, is the caller's name for what the counter's holds
	// are for (the engine's charger: its limit, *config.RateLimit); the
	// store keeps it only to hand it back with tokens of holds it finds
	// expired after the call returned (ExpiryReporter). Opaque to the store.
	Owner any
}

// On reports whether the counter touches holds.
func (h Hold) On() bool { return h.Reserve > 0 || h.Release > 0 }

// Result is one counter's outcome.
type Result struct {
	// Total is the counter after the call's add (its value, for a check).
	Total uint64
	// Reserved is the tokens held by the counter's unfinished requests after
	// the call (reservation-aware counters only).
	Reserved uint64
	// Expired is the tokens of the counter's holds this call found past
	// their expiry and dropped.
	Expired uint64
	// Held: this check's request was admitted and its hold placed.
	Held bool
}

// HashIncr names one hash field a counter's hits are also added to.
type HashIncr struct {
	Key, Field string
}

// Store charges and reads counters.
type Store interface {
	// Charge adds each counter's Hits, places and releases holds, and writes
	// each counter's outcome into results (len(results) == len(counters)),
	// in one round trip, counting every hit exactly once (a call that fails
	// is buffered or replayed by the store, never silently dropped). On
	// error no result is meaningful; the caller applies its failure policy.
	// Implementations must return by ctx's deadline.
	Charge(ctx context.Context, counters []Counter, results []Result) error
	// Close releases connections. Charge must not be called after Close.
	Close() error
}

// HashWrites are the periodic writes of the shadow-week ledger
// (internal/ledger): increments of hash fields (denial counts, usage the
// over-limit cache answered) and absolute expiries of hashes. Increments are
// applied before expiries, so a hash created by them gets its expiry.
type HashWrites struct {
	Incr   []HashIncrBy
	Expire []HashExpire
}

// HashIncrBy adds N to one hash field.
type HashIncrBy struct {
	HashIncr
	N uint64
}

// HashExpire sets a hash's absolute expiry.
type HashExpire struct {
	Key string
	At  time.Time
}

// HashWriter is implemented by stores that hold the ledger's hashes, so its
// flushes go through the store (the valkey store's in-flight bound and stall
// guard cover them) rather than around it. Charges stay one round trip:
// usage of a charged counter rides in Counter.Ledger.
type HashWriter interface {
	WriteHashes(ctx context.Context, w HashWrites) error
}

// ErrUnavailable is wrapped by errors that mean the store could not be reached
// or did not answer in time; the caller's failure policy applies.
var ErrUnavailable = errors.New("store unavailable")

// ErrNotSent is wrapped (with ErrUnavailable) by errors that mean the call
// was not started: for Charge, its context was already done when Charge was
// called; for WriteHashes, the store was closed, not connected, stalled or
// had no free slot. The store applied none of its writes and kept none for
// later. They are the caller's to account for: the charger hands them to the
// store's Deferrer, as it does when it sees the deadline pass itself, and
// the ledger's Recorder keeps its batch for its next flush. Without this
// sentinel the two checks of one deadline (the charger's, then the store's)
// could disagree, and a deadline passing between them dropped the hits of a
// whole batch uncounted.
var ErrNotSent = errors.New("store call not started: context done")

// ErrRefused is wrapped by errors that mean the store refused the call as a
// whole and changed nothing (ErrFull, or an overflow in the memory store):
// the same counters in smaller calls may still be taken, so the charger
// retries each request of a refused batch on its own. Whether the failure
// policy applies is told by the error that wraps it (ErrUnavailable, ErrFull).
var ErrRefused = errors.New("store refused the call")

// ErrOverflow is wrapped by errors that mean a counter is at the store's
// maximum (MaxInt64) and cannot take the hits; it wraps ErrMalformedReply.
// The charger answers such a counter as saturated (over any limit) rather
// than applying the failure policy. A store that refused the whole call
// also wraps ErrRefused.
var ErrOverflow = fmt.Errorf("%w: counter overflow", ErrMalformedReply)

// Deferrer is implemented by stores that can take hits that certainly never
// reached them and apply them later (the valkey store's outage buffer; the
// memory store applies them at once). The charger hands it the hits of a
// call whose deadline passed before the call started, instead of dropping
// them. Defer must not block on the network.
type Deferrer interface {
	Defer(counters []Counter)
}

// ExpiryReporter is implemented by stores that may apply a charge after its
// call returned (the valkey store's outage buffer, replayed once Valkey
// answers again; the memory store's Defer): a release applied then can find
// the counter's older holds expired (Result.Expired), which no caller reads
// any more. The store hands those tokens to the func given here, with the
// counter's Hold.Owner, so they are counted where a call's own are (the
// engine's charger: ratelimit_reservation_expired_tokens_total). The func
// is called from the store's replayer, or within Defer, and must not block;
// a later call replaces it, nil removes it.
type ExpiryReporter interface {
	ReportExpired(f func(owner any, tokens uint64))
}

// ErrFull is wrapped by errors that mean the store refused to create a counter
// because it is at its bound (the embedded store's MaxCounters). Nothing of
// the call was applied. Unless the error also wraps ErrUnavailable (a store
// configured to leave it to the failure policy), the caller denies the
// request whatever its failure policy: a bounded store must still enforce,
// and allowing would let every new principal past the bound through
// uncounted.
// It wraps ErrRefused.
var ErrFull = fmt.Errorf("%w: store full", ErrRefused)

// ErrMalformedReply is wrapped by errors that mean the store answered with
// something that is not a counter (for example a key holding another type).
var ErrMalformedReply = errors.New("store: malformed reply")
