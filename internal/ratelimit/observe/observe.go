// Package observe is the one seam through which the rate limit decision
// tells the rest of the service what happened: metrics, the shadow-week
// ledger and threshold events are Observers that receive each descriptor's
// outcome and each request's verdict after the answer is built. Observers
// are told; they never change a decision.
package observe

import (
	"context"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/store"
)

// Descriptor is one limited descriptor's outcome (Item.Limit is non-nil).
// It is only valid during the call.
type Descriptor struct {
	Domain  string
	Entries []*rlcommon.RateLimitDescriptor_Entry
	// Item is the planned, charged and answered item: Hits, Cached, Total,
	// Over (before shadow and quota modes), Near.
	Item *decide.Item
	// StoreFailed: the store call failed and the failure policy answered.
	StoreFailed bool
	// GlobalShadow is the service's SHADOW_MODE.
	GlobalShadow bool
	// Now is the request's instant.
	Now time.Time
	// Names caches the ledger names of the descriptor for this request
	// from Annotate to Descriptor; nil (compute on demand) when no observer
	// annotates.
	Names *Names
}

// Request classes (the ratelimit_requests_total code label).
const (
	RequestOK          = "ok"
	RequestOverLimit   = "over_limit"
	RequestInvalid     = "invalid_argument"
	RequestUnavailable = "unavailable"
)

// Request is one request's verdict.
type Request struct {
	// Class is one of the Request* constants.
	Class string
	// GlobalShadowed: OVER_LIMIT answered OK because of SHADOW_MODE.
	GlobalShadowed bool
	// FailurePolicy is the policy that answered after a store error, "" when
	// the store answered (or was not needed).
	FailurePolicy string
}

// Observer receives outcomes. Methods run on the request path after the
// answer is built: keep them cheap and never block on the network.
//
// It is the one interface of the observers the engine is given; an observer
// may also implement Configurable, Annotator or charge.Events (the
// charger's bookkeeping: store latency and errors, cache hits, unsent
// hits), which the engine finds by type assertion.
type Observer interface {
	Descriptor(ctx context.Context, d *Descriptor)
	Request(ctx context.Context, r *Request)
}

// Annotator is an Observer that adds to a descriptor's counter before it is
// sent, so what it records rides in the charge's own round trip (the
// ledger's usage: one hash increment beside the counter's, see
// store.Counter.Ledger). Both methods run on the request path before the
// answer: keep them cheap, and change only the counter's side fields, never
// what decides.
type Annotator interface {
	Observer
	// Annotate may add to the counter c of d before it is sent.
	Annotate(d *Descriptor, c *store.Counter)
	// Cached: the over-limit cache answered d; its hits are charged later,
	// in a background batch, with no round trip to ride on.
	Cached(d *Descriptor)
}

// Configurable observers are told about every config change first.
type Configurable interface {
	SetConfig(c *config.Config)
}

// Names are a descriptor's ledger rule and principal, computed at most once
// per request (the usage field that rides in the charge and the threshold
// event need the same names).
type Names struct {
	rule      ledger.RuleID
	principal string
	ok        bool
}

// Reset forgets the names (a scratch reused for another request).
func (n *Names) Reset() { *n = Names{} }

// Of returns (once) the names of the descriptor; a nil *Names computes them
// every time.
func (n *Names) Of(domain, configRule string, entries []*rlcommon.RateLimitDescriptor_Entry, free uint64) (ledger.RuleID, string) {
	if n == nil {
		return ledger.FromDescriptor(domain, configRule, entries, free)
	}
	if !n.ok {
		n.rule, n.principal = ledger.FromDescriptor(domain, configRule, entries, free)
		n.ok = true
	}
	return n.rule, n.principal
}

// OfLimit is Of for the limit l: a limit the budget map scoped is named by
// its bucket (and an override's fixed principal), so the ledger and the
// threshold events follow the budget's counter.
func (n *Names) OfLimit(domain string, l *config.RateLimit, entries []*rlcommon.RateLimitDescriptor_Entry, free uint64) (ledger.RuleID, string) {
	r, p := n.Of(domain, l.Rule, entries, free)
	if sc := l.Scope; sc != nil {
		return ledger.FromScope(sc.Bucket, sc.Principal, sc.Fixed, p)
	}
	return r, p
}

// Multi tells several observers, in order.
type Multi []Observer

// Descriptor implements Observer.
func (m Multi) Descriptor(ctx context.Context, d *Descriptor) {
	for _, o := range m {
		o.Descriptor(ctx, d)
	}
}

// Request implements Observer.
func (m Multi) Request(ctx context.Context, r *Request) {
	for _, o := range m {
		o.Request(ctx, r)
	}
}

// SetConfig passes the config to every Configurable observer.
func (m Multi) SetConfig(c *config.Config) {
	for _, o := range m {
		if cf, ok := o.(Configurable); ok {
			cf.SetConfig(c)
		}
	}
}
