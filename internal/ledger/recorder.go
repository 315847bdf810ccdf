package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
)

// DefaultMaxPendingPrincipals bounds the per-principal denial counts a
// Recorder holds between flushes; past it only the windows' totals are
// counted (the report then says its per-principal 429s are a lower bound).
const DefaultMaxPendingPrincipals = 100_000

// Usage is the one extra write of a charge: add Tokens to field Field of hash
// Key (HINCRBY), sent in the same round trip as the counter.
type Usage struct {
	Key    string
	Field  string
	Tokens uint64
}

// Batch is what a Recorder flushes: denial and reservation counts and the
// expiry of every hash it has touched in a current or just-ended window.
type Batch struct {
	// Expire maps hash keys to their absolute expiry; EXPIREAT is idempotent,
	// so re-sending it every flush also repairs a key recreated after a store
	// restart.
	Expire map[string]time.Time
	// Denials adds counts to fields of stats hashes (denials, and the
	// window's reservation totals): key -> field -> n.
	Denials map[string]map[string]uint64
	// Usage adds deferred usage (charges the service answered from its local
	// over-limit cache, with no round trip to ride on): key -> field -> n.
	Usage map[string]map[string]uint64
}

// Sink applies a Batch (Valkey or the in-memory ledger).
type Sink interface {
	Apply(ctx context.Context, b Batch) error
}

// Denial is one over-limit answer as the Recorder counts it.
type Denial struct {
	// Principal is the encoded principal (EncodePrincipal), "" for a shared
	// bucket or when unknown.
	Principal string
	// Shadow: a would-be 429 (the rule or the service is in shadow mode).
	Shadow bool
	// Reserve: over only because of the bucket's reservations.
	Reserve bool
}

// Recorder is the service side of the ledger: it builds the usage write of a
// charge, counts denials locally and flushes them with the expiries. Safe for
// concurrent use.
type Recorder struct {
	opts Options
	sink Sink
	now  func() time.Time

	keys sync.Map // ruleWindow -> *windowKeys

	mu        sync.Mutex
	denials   map[ruleWindow]*windowDenials
	principal int // per-principal entries in denials
	deferred  map[Usage]uint64
}

type ruleWindow struct {
	rule RuleID
	w    Window
}

type windowKeys struct{ usage, stats string }

// windowDenials is what a window has pending: its denials (totals and,
// within the bound, each principal's) and its reservation totals.
type windowDenials struct {
	total Denials
	per   map[string]Denials
	holds Holds
}

// NewRecorder returns a Recorder writing through sink. now is the clock used
// to forget old windows' keys (time.Now when nil).
func NewRecorder(opts Options, sink Sink, now func() time.Time) (*Recorder, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if sink == nil {
		return nil, fmt.Errorf("ledger recorder: no sink")
	}
	if now == nil {
		now = time.Now
	}
	return &Recorder{opts: opts, sink: sink, now: now, denials: map[ruleWindow]*windowDenials{}, deferred: map[Usage]uint64{}}, nil
}

// Location is the zone whose dates name the windows (Options.Location).
func (r *Recorder) Location() *time.Location { return r.opts.Location }

func (r *Recorder) keysFor(rule RuleID, w Window) *windowKeys {
	k := ruleWindow{rule, w}
	if v, ok := r.keys.Load(k); ok {
		return v.(*windowKeys)
	}
	v, _ := r.keys.LoadOrStore(k, &windowKeys{usage: WindowUsageKey(r.opts.Prefix, rule, w), stats: WindowStatsKey(r.opts.Prefix, rule, w)})
	return v.(*windowKeys)
}

// Usage returns the write recording tokens for principal (EncodePrincipal's
// output) under rule in the day window holding at. It sends nothing itself:
// the store pipelines it with the charge.
func (r *Recorder) Usage(rule RuleID, principal string, at time.Time, tokens uint64) Usage {
	return r.UsageIn(rule, principal, WindowAt(PeriodDay, at, r.opts.Location), tokens)
}

// UsageIn is Usage for window w (WindowOfCounter names a counter's).
func (r *Recorder) UsageIn(rule RuleID, principal string, w Window, tokens uint64) Usage {
	return Usage{Key: r.keysFor(rule, w).usage, Field: principal, Tokens: tokens}
}

// Defer records usage that has no charge round trip to ride on (a charge the
// service answered from its local over-limit cache and charges later); it is
// written at the next Flush.
func (r *Recorder) Defer(u Usage) {
	if u.Tokens == 0 {
		return
	}
	n := u.Tokens
	u.Tokens = 0
	r.mu.Lock()
	r.deferred[u] += n
	r.mu.Unlock()
}

// Denied counts one over-limit answer of rule in the day window holding
// at, with no principal: a would-be 429 when shadow, a real one otherwise.
func (r *Recorder) Denied(rule RuleID, at time.Time, shadow bool) {
	r.DeniedIn(rule, WindowAt(PeriodDay, at, r.opts.Location), Denial{Shadow: shadow})
}

// DeniedIn counts one over-limit answer of rule in window w, in the window's
// totals and, within the Recorder's bound, the principal's. It is written at
// the next Flush.
func (r *Recorder) DeniedIn(rule RuleID, w Window, d Denial) {
	k := ruleWindow{rule, w}
	r.keysFor(rule, w)
	var one Denials
	if d.Shadow {
		one.Shadow = 1
	} else {
		one.Enforce = 1
	}
	if d.Reserve {
		one.Reserve = 1
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	wd := r.denials[k]
	if wd == nil {
		wd = &windowDenials{}
		r.denials[k] = wd
	}
	wd.total.Add(one)
	if d.Principal == "" {
		return
	}
	pd, ok := wd.per[d.Principal]
	if !ok {
		if r.principal >= r.maxPending() {
			return // the total counts it; the principal's own count is dropped
		}
		if wd.per == nil {
			wd.per = map[string]Denials{}
		}
		r.principal++
	}
	pd.Add(one)
	wd.per[d.Principal] = pd
}

// HoldsIn adds reservations of rule in window w to the window's totals (no
// principal: a Recorder keeps one entry per rule-window, bounded by the
// config's rules, not by traffic). It is written at the next Flush.
func (r *Recorder) HoldsIn(rule RuleID, w Window, h Holds) {
	if h.IsZero() {
		return
	}
	k := ruleWindow{rule, w}
	r.keysFor(rule, w)
	r.mu.Lock()
	defer r.mu.Unlock()
	wd := r.denials[k]
	if wd == nil {
		wd = &windowDenials{}
		r.denials[k] = wd
	}
	wd.holds.Add(h)
}

func (r *Recorder) maxPending() int {
	if r.opts.MaxPendingPrincipals > 0 {
		return r.opts.MaxPendingPrincipals
	}
	return DefaultMaxPendingPrincipals
}

// Flush writes pending denials and reservations and the expiries of current
// hashes. When the sink says it sent nothing (store.ErrNotSent) they are
// kept for the next Flush. Any other error may come after the writes were
// applied (a send that timed out or lost its connection): sending them again
// would count them twice, so they are given up and the error says how much.
func (r *Recorder) Flush(ctx context.Context) error {
	b := Batch{Expire: r.expiries(), Denials: map[string]map[string]uint64{}, Usage: map[string]map[string]uint64{}}
	r.mu.Lock()
	pending, deferred := r.denials, r.deferred
	r.denials, r.deferred, r.principal = map[ruleWindow]*windowDenials{}, map[Usage]uint64{}, 0
	r.mu.Unlock()
	for u, n := range deferred {
		if b.Usage[u.Key] == nil {
			b.Usage[u.Key] = map[string]uint64{}
		}
		b.Usage[u.Key][u.Field] += n
	}
	for rw, wd := range pending {
		sk := WindowStatsKey(r.opts.Prefix, rw.rule, rw.w)
		b.Denials[sk] = wd.fields()
		b.Expire[sk] = rw.w.ExpireAt(r.opts.RetentionDays, r.opts.Location)
	}
	if len(b.Expire) == 0 && len(b.Denials) == 0 && len(b.Usage) == 0 {
		return nil
	}
	if err := r.sink.Apply(ctx, b); err != nil {
		if errors.Is(err, store.ErrNotSent) {
			r.restore(pending, deferred)
			return fmt.Errorf("ledger flush: kept for the next flush: %w", err)
		}
		return fmt.Errorf("ledger flush: maybe applied, not sent again (a second send could count it twice): %d denial and hold counts, %d deferred tokens: %w",
			sumFields(b.Denials), sumFields(b.Usage), err)
	}
	return nil
}

func sumFields(m map[string]map[string]uint64) uint64 {
	var n uint64
	for _, fs := range m {
		for _, v := range fs {
			n += v
		}
	}
	return n
}

// expiries are the expiries of the hashes of every window still current or
// ended less than a day ago; older windows are forgotten (their expiry was
// set while they were current).
func (r *Recorder) expiries() map[string]time.Time {
	now := r.now()
	out := map[string]time.Time{}
	r.keys.Range(func(k, v any) bool {
		rw := k.(ruleWindow)
		if !now.Before(rw.w.End(r.opts.Location).Add(24 * time.Hour)) {
			r.keys.Delete(k)
			return true
		}
		wk := v.(*windowKeys)
		exp := rw.w.ExpireAt(r.opts.RetentionDays, r.opts.Location)
		out[wk.usage] = exp
		out[wk.stats] = exp
		return true
	})
	return out
}

// fields are the stats hash increments of one window's denials and holds.
func (wd *windowDenials) fields() map[string]uint64 {
	f := map[string]uint64{}
	put := func(kind, p string, n uint64) {
		if n == 0 {
			return
		}
		if p == "" {
			f[kind] += n
		} else {
			f[PrincipalDenialField(kind, p)] += n
		}
	}
	for p, d := range wd.per {
		put(FieldShadowDenials, p, d.Shadow)
		put(FieldEnforceDenials, p, d.Enforce)
		put(FieldReserveDenials, p, d.Reserve)
	}
	put(FieldShadowDenials, "", wd.total.Shadow)
	put(FieldEnforceDenials, "", wd.total.Enforce)
	put(FieldReserveDenials, "", wd.total.Reserve)
	put(FieldHolds, "", wd.holds.Count)
	put(FieldHeldUnits, "", wd.holds.Held)
	put(FieldExpiredUnits, "", wd.holds.Expired)
	return f
}

// restore puts back what a failed flush took.
func (r *Recorder) restore(pending map[ruleWindow]*windowDenials, deferred map[Usage]uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for rw, wd := range pending {
		cur := r.denials[rw]
		if cur == nil {
			cur = &windowDenials{}
			r.denials[rw] = cur
		}
		cur.total.Add(wd.total)
		cur.holds.Add(wd.holds)
		for p, d := range wd.per {
			pd, ok := cur.per[p]
			if !ok {
				if cur.per == nil {
					cur.per = map[string]Denials{}
				}
				r.principal++
			}
			pd.Add(d)
			cur.per[p] = pd
		}
	}
	for u, n := range deferred {
		r.deferred[u] += n
	}
}

// Run flushes every interval until ctx is done, then flushes once more with
// a short deadline. Errors go to onErr (may be nil).
func (r *Recorder) Run(ctx context.Context, interval time.Duration, onErr func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	flush := func(ctx context.Context) {
		fctx, cancel := context.WithTimeout(ctx, interval)
		defer cancel()
		if err := r.Flush(fctx); err != nil && onErr != nil {
			onErr(err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			flush(context.WithoutCancel(ctx))
			return
		case <-t.C:
			flush(ctx)
		}
	}
}
