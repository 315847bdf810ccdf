// Package store defines the counter store the rate limit decision engine
// depends on, sized for one round trip per request. Implementations live in
// sub-packages (memory, valkey) and pass the same behaviour suite (storetest).
package store

import (
	"context"
	"errors"
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
}

// HashIncr names one hash field a counter's hits are also added to.
type HashIncr struct {
	Key, Field string
}

// Store charges and reads counters.
type Store interface {
	// Charge adds each counter's Hits and writes each counter's value after the
	// add into totals (len(totals) == len(counters)), in one round trip.
	// On error no total is meaningful; the caller applies its failure policy.
	// Implementations must return by ctx's deadline.
	Charge(ctx context.Context, counters []Counter, totals []uint64) error
	// Close releases connections. Charge must not be called after Close.
	Close() error
}

// ErrUnavailable is wrapped by errors that mean the store could not be reached
// or did not answer in time; the caller's failure policy applies.
var ErrUnavailable = errors.New("store unavailable")

// ErrFull is wrapped by errors that mean the store refused to create a counter
// because it is at its bound (the embedded store's MaxCounters). Nothing of
// the call was applied. Unless the error also wraps ErrUnavailable (a store
// configured to leave it to the failure policy), the caller denies the
// request whatever its failure policy: a bounded store must still enforce,
// and allowing would let every new principal past the bound through
// uncounted.
var ErrFull = errors.New("store full")

// ErrMalformedReply is wrapped by errors that mean the store answered with
// something that is not a counter (for example a key holding another type).
var ErrMalformedReply = errors.New("store: malformed reply")
