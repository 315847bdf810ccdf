// Package decide is the pure core of the rate limit service: it plans the
// counters a request touches (Plan) and answers from their totals (Answer),
// exactly as envoyproxy/ratelimit does (src/limiter/base_limiter.go,
// src/redis/fixed_cache_impl.go, src/service/ratelimit.go). It starts no
// goroutine and knows no store, metric or gRPC code: the charge package
// turns items into store calls, observers are told the outcomes, and the
// server maps the typed errors to gRPC statuses.
package decide

import (
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
)

// Window is the one place that maps a limit's unit and an instant to its
// window [start, end) in Unix seconds: w's calendar windows (the default, in
// its time zone) or the reference's epoch windows (window.Epoch). ok is false
// for a unit with no window.
func Window(w window.Windows, unit config.Unit, now int64) (start, end int64, ok bool) {
	return w.Bounds(window.Unit(unit), now)
}

// Item is the plan (and, after charging and Answer, the outcome) of one
// request descriptor.
type Item struct {
	// Limit is the limit that applies; nil when none does (unmatched,
	// unknown domain, unlimited or replaced).
	Limit *config.RateLimit
	// Unlimited marks a descriptor matched by an unlimited rule.
	Unlimited bool
	// Hits is what the descriptor adds (0: check only).
	Hits uint64
	// Free is config.Match.Free: which entries' values came from the request.
	Free uint64
	// WindowStart and WindowEnd bound the counter's window (Unix seconds).
	WindowStart, WindowEnd int64
	// Key is the encoded counter key (into the Scratch's buffer; valid until
	// the Scratch is reused).
	Key []byte

	// Set by the charger: Cached when the over-limit cache answered (no
	// store total), else Slot indexes the store call's totals.
	Cached bool
	Slot   int

	// Set by Answer.
	Total uint64 // the counter after the charge (0 when cached or failed)
	Over  bool   // above the limit, before shadow and quota modes
	Near  bool   // OK but above the near-limit ratio

	// Reservations (a rule whose budget reserves, config.Budget.Reserve):
	// Reserve is what a check on it holds if admitted (0: none, or not a
	// check); Reserved the tokens held by the bucket's unfinished requests
	// after the call; Held that this check was admitted and holds Reserve;
	// ReserveDenied that it is Over only because of the holds (the counter
	// alone was within the limit). Expired is the tokens of the bucket's
	// holds this call found past their expiry and released (their charge
	// never came).
	Reserve, Reserved, Expired uint64
	Held, ReserveDenied        bool

	share            []string // config.Match.SharePatterns
	keyStart, keyEnd int
}

// Scratch holds buffers Plan reuses between requests (one per goroutine).
type Scratch struct {
	items  []Item
	keys   []byte
	lookup []byte
}

// Planner plans requests with one key encoding and one way of placing
// counters in time.
type Planner struct {
	Keys key.Encoder
	// Windows: the zero value is calendar windows in UTC.
	Windows window.Windows
}

// HitsAddend is the reference's utils.GetHitsAddends for one descriptor: a
// descriptor-level value wins (0 is honoured: check only), else the
// request's, where 0 means 1.
func HitsAddend(req *rlpb.RateLimitRequest, d *rlcommon.RateLimitDescriptor) uint64 {
	if h := d.GetHitsAddend(); h != nil {
		return h.Value
	}
	return max(1, uint64(req.GetHitsAddend()))
}

// Plan matches a validated request's descriptors against cfg and returns one
// item per descriptor, with the counter key of each limited one. It applies
// unlimited rules and "replaces" (a matched rule naming another removes that
// one from the whole request).
func (p Planner) Plan(cfg *config.Config, req *rlpb.RateLimitRequest, now time.Time, s *Scratch) []Item {
	n := len(req.Descriptors)
	if cap(s.items) < n {
		s.items = make([]Item, n)
	}
	items := s.items[:n]
	var replacing map[string]struct{}
	for i, d := range req.Descriptors {
		var mt config.Match
		mt, s.lookup = cfg.Lookup(req.Domain, d, s.lookup)
		items[i] = Item{Limit: mt.Limit, Hits: HitsAddend(req, d), Slot: -1, Free: mt.Free}
		if l := mt.Limit; l != nil {
			for _, r := range l.Replaces {
				if replacing == nil {
					replacing = map[string]struct{}{}
				}
				replacing[r] = struct{}{}
			}
			if l.Unlimited {
				items[i].Unlimited = true
				items[i].Limit = nil
			}
		}
		items[i].share = mt.SharePatterns
	}
	if replacing != nil {
		for i := range items {
			if l := items[i].Limit; l != nil && l.Name != "" {
				if _, ok := replacing[l.Name]; ok {
					items[i].Limit = nil
				}
			}
		}
	}
	unix := now.Unix()
	keys := s.keys[:0]
	for i := range items {
		it := &items[i]
		l := it.Limit
		if l == nil {
			continue
		}
		var ok bool
		if it.WindowStart, it.WindowEnd, ok = Window(p.Windows, l.Unit, unix); !ok {
			it.Limit = nil // config.Load rejects such a unit; never divide by zero
			continue
		}
		it.keyStart = len(keys)
		// The key names the window by its start and length, so a calendar
		// window that equals an epoch one (a UTC day) keeps the same counter.
		if sc := l.Scope; sc != nil {
			// A budget map names this rule: one counter per (bucket, principal, window).
			keys = p.Keys.AppendBudget(keys, sc.Bucket, sc.Principal, sc.Fixed, req.Descriptors[i].Entries, it.Free, it.WindowEnd-it.WindowStart, it.WindowStart)
		} else {
			keys = p.Keys.Append(keys, req.Domain, req.Descriptors[i].Entries, it.share, it.WindowEnd-it.WindowStart, it.WindowStart)
		}
		it.keyEnd = len(keys)
	}
	// Slice keys only once the buffer stopped growing.
	for i := range items {
		if it := &items[i]; it.Limit != nil {
			it.Key = keys[it.keyStart:it.keyEnd:it.keyEnd]
		}
	}
	s.keys = keys
	return items
}
