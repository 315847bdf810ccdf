package observe

import (
	"context"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/thresholds"
)

// dayUnit is the window of the rules the ledger and thresholds measure.
const dayUnit = rlpb.RateLimitResponse_RateLimit_DAY

// Ledger feeds the shadow-week ledger (internal/ledger) and the 80/90/100%
// threshold events (internal/thresholds) of day-window rules. Either may be
// nil. A charged descriptor's usage rides in its store call (Annotate); the
// other measurements are told after the answer.
type Ledger struct {
	Recorder   *ledger.Recorder
	Thresholds *thresholds.Detector
}

// measured reports whether the ledger or thresholds care about an item.
func (o *Ledger) measured(it *decide.Item) bool {
	return (o.Recorder != nil || o.Thresholds != nil) && it.Limit != nil && it.Limit.Unit == dayUnit
}

// Annotate adds the usage field of a charged day-window descriptor to its
// counter, so the ledger write shares the charge's round trip.
func (o *Ledger) Annotate(d *Descriptor, c *store.Counter) {
	it := d.Item
	if o.Recorder == nil || it.Hits == 0 || it.Limit.Unit != dayUnit {
		return
	}
	r, p := d.Names.OfLimit(d.Domain, it.Limit, d.Entries, it.Free)
	u := o.Recorder.Usage(r, p, d.Now, it.Hits)
	c.Ledger = store.HashIncr{Key: u.Key, Field: u.Field}
}

// Cached records the usage of a day-window descriptor the over-limit cache
// answered: it is charged later, with no round trip to ride on.
func (o *Ledger) Cached(d *Descriptor) {
	it := d.Item
	if o.Recorder == nil || it.Hits == 0 || it.Limit.Unit != dayUnit {
		return
	}
	r, p := d.Names.OfLimit(d.Domain, it.Limit, d.Entries, it.Free)
	o.Recorder.Defer(o.Recorder.Usage(r, p, d.Now, it.Hits))
}

// Descriptor implements Observer. A 429, would-be (shadow) or real, is a
// request-path check (hits 0, Envoy Gateway's token rules) answered over the
// limit; a response-path charge going over is tokens above the cap, not a
// 429. Thresholds need the total after a charge the store answered.
func (o *Ledger) Descriptor(ctx context.Context, d *Descriptor) {
	it := d.Item
	if !o.measured(it) {
		return
	}
	l := it.Limit
	if !it.Cached && d.StoreFailed {
		return
	}
	if it.Over && it.Hits == 0 && o.Recorder != nil {
		r, _ := d.Names.OfLimit(d.Domain, l, d.Entries, it.Free)
		o.Recorder.Denied(r, d.Now, l.ShadowMode || d.GlobalShadow)
	}
	if !it.Cached && it.Hits > 0 && o.Thresholds != nil {
		r, p := d.Names.OfLimit(d.Domain, l, d.Entries, it.Free)
		o.Thresholds.Observe(ctx, thresholds.Charge{
			Domain: r.Domain, Rule: r.Rule, Principal: ledger.PrincipalName(p),
			Limit: uint64(l.RequestsPerUnit), Hits: it.Hits, Total: it.Total, Shadow: l.ShadowMode,
		})
	}
}

// Request implements Observer.
func (o *Ledger) Request(context.Context, *Request) {}
