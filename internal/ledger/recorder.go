package ledger

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Usage is the one extra write of a charge: add Tokens to field Field of hash
// Key (HINCRBY), sent in the same round trip as the counter.
type Usage struct {
	Key    string
	Field  string
	Tokens uint64
}

// Batch is what a Recorder flushes: denial counts and the expiry of every
// hash it has touched on the current and previous day.
type Batch struct {
	// Expire maps hash keys to their absolute expiry; EXPIREAT is idempotent,
	// so re-sending it every flush also repairs a key recreated after a store
	// restart.
	Expire map[string]time.Time
	// Denials adds counts to fields of stats hashes: key -> field -> n.
	Denials map[string]map[string]uint64
	// Usage adds deferred usage (charges the service answered from its local
	// over-limit cache, with no round trip to ride on): key -> field -> n.
	Usage map[string]map[string]uint64
}

// Sink applies a Batch (Valkey or the in-memory ledger).
type Sink interface {
	Apply(ctx context.Context, b Batch) error
}

// Recorder is the service side of the ledger: it builds the usage write of a
// charge, counts denials locally and flushes them with the expiries. Safe for
// concurrent use.
type Recorder struct {
	opts Options
	sink Sink
	now  func() time.Time

	keys sync.Map // ruleDay -> *dayKeys

	mu       sync.Mutex
	denials  map[ruleDay][2]uint64 // [shadow, enforce]
	deferred map[Usage]uint64      // Tokens zero in the key
}

type ruleDay struct {
	rule RuleID
	day  Day
}

type dayKeys struct{ usage, stats string }

// NewRecorder returns a Recorder writing through sink. now is the clock used
// to forget old days' keys (time.Now when nil).
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
	return &Recorder{opts: opts, sink: sink, now: now, denials: map[ruleDay][2]uint64{}, deferred: map[Usage]uint64{}}, nil
}

func (r *Recorder) keysFor(rule RuleID, d Day) *dayKeys {
	k := ruleDay{rule, d}
	if v, ok := r.keys.Load(k); ok {
		return v.(*dayKeys)
	}
	v, _ := r.keys.LoadOrStore(k, &dayKeys{usage: UsageKey(r.opts.Prefix, rule, d), stats: StatsKey(r.opts.Prefix, rule, d)})
	return v.(*dayKeys)
}

// Usage returns the write recording tokens for principal (EncodePrincipal's
// output) under rule on the UTC day of at. It sends nothing itself: the store
// pipelines it with the charge.
func (r *Recorder) Usage(rule RuleID, principal string, at time.Time, tokens uint64) Usage {
	return Usage{Key: r.keysFor(rule, DayIn(at, r.opts.Location)).usage, Field: principal, Tokens: tokens}
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

// Denied counts one over-limit answer of rule on the UTC day of at: a
// would-be 429 when shadow, a real one otherwise. It is written at the next
// Flush.
func (r *Recorder) Denied(rule RuleID, at time.Time, shadow bool) {
	k := ruleDay{rule, DayIn(at, r.opts.Location)}
	r.keysFor(rule, k.day)
	r.mu.Lock()
	c := r.denials[k]
	if shadow {
		c[0]++
	} else {
		c[1]++
	}
	r.denials[k] = c
	r.mu.Unlock()
}

// Flush writes pending denials and the expiries of current hashes. On error
// the denials are kept for the next Flush.
func (r *Recorder) Flush(ctx context.Context) error {
	today := DayIn(r.now(), r.opts.Location)
	b := Batch{Expire: map[string]time.Time{}, Denials: map[string]map[string]uint64{}, Usage: map[string]map[string]uint64{}}
	r.keys.Range(func(k, v any) bool {
		rd := k.(ruleDay)
		if rd.day < today-1 {
			// Older days get no more writes; their expiry was set while current.
			r.keys.Delete(k)
			return true
		}
		dk := v.(*dayKeys)
		exp := rd.day.ExpireAt(r.opts.RetentionDays)
		b.Expire[dk.usage] = exp
		b.Expire[dk.stats] = exp
		return true
	})
	r.mu.Lock()
	pending := r.denials
	r.denials = map[ruleDay][2]uint64{}
	deferred := r.deferred
	r.deferred = map[Usage]uint64{}
	r.mu.Unlock()
	for u, n := range deferred {
		if b.Usage[u.Key] == nil {
			b.Usage[u.Key] = map[string]uint64{}
		}
		b.Usage[u.Key][u.Field] += n
	}
	for rd, c := range pending {
		sk := StatsKey(r.opts.Prefix, rd.rule, rd.day)
		f := map[string]uint64{}
		if c[0] > 0 {
			f[FieldShadowDenials] = c[0]
		}
		if c[1] > 0 {
			f[FieldEnforceDenials] = c[1]
		}
		b.Denials[sk] = f
		b.Expire[sk] = rd.day.ExpireAt(r.opts.RetentionDays)
	}
	if len(b.Expire) == 0 && len(b.Denials) == 0 && len(b.Usage) == 0 {
		return nil
	}
	if err := r.sink.Apply(ctx, b); err != nil {
		r.mu.Lock()
		for rd, c := range pending {
			cur := r.denials[rd]
			cur[0] += c[0]
			cur[1] += c[1]
			r.denials[rd] = cur
		}
		for u, n := range deferred {
			r.deferred[u] += n
		}
		r.mu.Unlock()
		return fmt.Errorf("ledger flush: %w", err)
	}
	return nil
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
