package observe

import (
	"context"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/thresholds"
)

// measuredPeriods are the rule units the ledger and thresholds measure: the
// windows a budget can have (hour, day, week, month).
var measuredPeriods = map[config.Unit]ledger.Period{
	rlpb.RateLimitResponse_RateLimit_HOUR:  ledger.PeriodHour,
	rlpb.RateLimitResponse_RateLimit_DAY:   ledger.PeriodDay,
	rlpb.RateLimitResponse_RateLimit_WEEK:  ledger.PeriodWeek,
	rlpb.RateLimitResponse_RateLimit_MONTH: ledger.PeriodMonth,
}

// Ledger feeds the ledger (internal/ledger) and the 80/90/100% threshold
// events (internal/thresholds) of hour, day, week and month rules. Either
// may be nil. It is an Annotator: a charged descriptor's usage rides in its
// store call (Annotate); the other measurements are told after the answer.
type Ledger struct {
	Recorder   *ledger.Recorder
	Thresholds *thresholds.Detector
}

// window is the ledger window of an item's counter; ok is false for a rule
// the ledger does not measure.
func (o *Ledger) window(it *decide.Item) (ledger.Window, bool) {
	if it.Limit == nil {
		return ledger.Window{}, false
	}
	p, ok := measuredPeriods[it.Limit.Unit]
	if !ok {
		return ledger.Window{}, false
	}
	var loc *time.Location
	if o.Recorder != nil {
		loc = o.Recorder.Location()
	}
	return ledger.WindowOfCounter(p, it.WindowStart, loc), true
}

// Annotate adds the usage field of a charged descriptor to its counter, so
// the ledger write shares the charge's round trip (one HINCRBY per counter).
func (o *Ledger) Annotate(d *Descriptor, c *store.Counter) {
	it := d.Item
	if o.Recorder == nil || it.Hits == 0 {
		return
	}
	w, ok := o.window(it)
	if !ok {
		return
	}
	r, p := d.Names.OfLimit(d.Domain, it.Limit, d.Entries, it.Free)
	u := o.Recorder.UsageIn(r, p, w, it.Hits)
	c.Ledger = store.HashIncr{Key: u.Key, Field: u.Field}
}

// Cached records the usage of a descriptor the over-limit cache answered:
// it is charged later, with no round trip to ride on.
func (o *Ledger) Cached(d *Descriptor) {
	it := d.Item
	if o.Recorder == nil || it.Hits == 0 {
		return
	}
	w, ok := o.window(it)
	if !ok {
		return
	}
	r, p := d.Names.OfLimit(d.Domain, it.Limit, d.Entries, it.Free)
	o.Recorder.Defer(o.Recorder.UsageIn(r, p, w, it.Hits))
}

// Descriptor implements Observer. A 429, would-be (shadow) or real, is a
// request-path check (hits 0, Envoy Gateway's token rules) answered over the
// limit; a response-path charge going over is usage above the cap, not a
// 429. A check over only because of the bucket's reservations
// (Item.ReserveDenied) is also counted as a reservation denial. A check that
// placed a hold (Item.Held) and holds found expired (Item.Expired) are added
// to the window's reservation totals, whatever the mode (a shadow budget
// reserves too), as the metrics observer counts them. Thresholds need the
// total after a charge the store answered.
func (o *Ledger) Descriptor(ctx context.Context, d *Descriptor) {
	it := d.Item
	if o.Recorder == nil && o.Thresholds == nil {
		return
	}
	w, ok := o.window(it)
	if !ok || !it.Cached && d.StoreFailed {
		return
	}
	l := it.Limit
	if it.Over && it.Hits == 0 && o.Recorder != nil {
		r, p := d.Names.OfLimit(d.Domain, l, d.Entries, it.Free)
		o.Recorder.DeniedIn(r, w, ledger.Denial{Principal: p, Shadow: l.ShadowMode || d.GlobalShadow, Reserve: it.ReserveDenied})
	}
	if o.Recorder != nil && (it.Held || it.Expired > 0) {
		r, _ := d.Names.OfLimit(d.Domain, l, d.Entries, it.Free)
		o.Recorder.HoldsIn(r, w, holdsOf(it))
	}
	if !it.Cached && it.Hits > 0 && o.Thresholds != nil {
		r, p := d.Names.OfLimit(d.Domain, l, d.Entries, it.Free)
		o.Thresholds.Observe(ctx, thresholds.Charge{
			Domain: r.Domain, Rule: r.Rule, Principal: ledger.PrincipalName(p),
			Limit: uint64(l.RequestsPerUnit), Hits: it.Hits, Total: it.Total, Shadow: l.ShadowMode,
			Window: w.Period.String(), WindowStart: w.Start(o.location()),
		})
	}
}

// holdsOf is an item's reservation outcome as the ledger counts it.
func holdsOf(it *decide.Item) ledger.Holds {
	h := ledger.Holds{Expired: it.Expired}
	if it.Held {
		h.Count, h.Held = 1, it.Reserve
	}
	return h
}

func (o *Ledger) location() *time.Location {
	if o.Recorder != nil {
		return o.Recorder.Location()
	}
	return nil
}

// Request implements Observer.
func (o *Ledger) Request(context.Context, *Request) {}

var _ Annotator = (*Ledger)(nil)
