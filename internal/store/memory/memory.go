// Package memory is the embedded counter store used when no Valkey address is
// configured: one process, persisted only by a Snapshotter (snapshot.go,
// MEMORY_SNAPSHOT_PATH), the same semantics as the Valkey
// store (absolute expiry set on first write, check-only reads that create
// nothing, one atomic step per call).
//
// Memory is bounded by Options.MaxCounters and Options.MaxBytes (the
// counters' keys, up to 8 KiB each, plus CounterOverhead each). At either
// bound a call that needs a new counter first reclaims, in the shards it holds, the counters that have
// expired and those of windows that have ended (their expiry is within
// Options.Grace: only their grace period is left, and no request charges an
// ended window's key again); these are counted in Stats().Evicted. If the
// store is still full, the janitor is asked for a full sweep and the call is
// refused as a whole with ErrFull, counted in Stats().Refused. ErrFull wraps
// store.ErrFull, so the caller denies the request (FullDeny, the default: a
// bounded store still enforces), or, with FullFailurePolicy, also
// store.ErrUnavailable, so the caller's failure policy applies. Counts of
// live windows are never dropped: existing counters keep counting.
package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
)

// Defaults for Options.
const (
	// DefaultMaxCounters bounds live counters (about 100 bytes each plus the
	// key, so roughly 150 MB for one million 50-byte keys).
	DefaultMaxCounters = 1_000_000
	// DefaultMaxBytes bounds what live counters hold (their keys plus
	// CounterOverhead each): one million counters of keys up to 140 bytes
	// fit, so DefaultMaxCounters is reached first with the service's usual
	// keys, while counters of long keys (a descriptor value is up to 8 KiB)
	// stop at 256 MiB instead of about 8 GiB.
	DefaultMaxBytes = 256 << 20
	// CounterOverhead is what a counter holds beside its key's bytes: its
	// map slot, the key's string header and size class, and a reserving
	// counter's holds (measured with runtime.MemStats: about 70 bytes for
	// a plain counter, 120 for a reserving one; TestCounterOverheadCoversTheHeap).
	CounterOverhead = 128
	// DefaultShards is the number of independently locked maps.
	DefaultShards = 64
	// DefaultSweepInterval is how often the janitor removes expired counters.
	DefaultSweepInterval = 5 * time.Second
)

// ErrFull is returned (wrapping store.ErrFull) when a call needs a new
// counter and the store already holds MaxCounters live counters. With
// FullFailurePolicy the error returned also wraps store.ErrUnavailable;
// errors.Is(err, ErrFull) holds for both.
var ErrFull = fmt.Errorf("%w: memory store full", store.ErrFull)

var errFullUnavailable = fmt.Errorf("%w: %w", store.ErrUnavailable, ErrFull)

// FullPolicy is what a call needing a new counter gets at the bound.
type FullPolicy uint8

// Full policies (MEMORY_FULL_POLICY).
const (
	// FullDeny: ErrFull, which the engine answers by denying (fail closed).
	FullDeny FullPolicy = iota
	// FullFailurePolicy: ErrFull wrapping store.ErrUnavailable, answered by
	// the engine's failure policy (allow lets new principals through
	// uncounted, as before issue 16).
	FullFailurePolicy
)

// FullPolicyNames are the names ParseFullPolicy accepts, by value.
var FullPolicyNames = []string{"deny", "failure-policy"}

func (p FullPolicy) String() string {
	if int(p) < len(FullPolicyNames) {
		return FullPolicyNames[p]
	}
	return fmt.Sprintf("FullPolicy(%d)", p)
}

// ParseFullPolicy parses deny or failure-policy; "" is deny.
func ParseFullPolicy(s string) (FullPolicy, error) {
	switch s {
	case "", "deny":
		return FullDeny, nil
	case "failure-policy":
		return FullFailurePolicy, nil
	}
	return FullDeny, fmt.Errorf("unknown memory full policy %q (want deny or failure-policy)", s)
}

var errClosed = fmt.Errorf("%w: memory store closed", store.ErrUnavailable)

// Options tune the store. The zero value means every default.
type Options struct {
	// MaxCounters bounds the number of live counters. Default DefaultMaxCounters.
	MaxCounters int
	// MaxBytes bounds the bytes of live counters: their keys plus
	// CounterOverhead each. At it the store behaves as at MaxCounters
	// (reclaim, then FullPolicy). Default DefaultMaxBytes.
	MaxBytes int64
	// Shards is the number of independently locked maps, rounded up to a power
	// of two. Default DefaultShards.
	Shards int
	// SweepInterval is how often the janitor removes expired counters. Expired
	// counters are also ignored (and replaced) when touched, so this only
	// bounds how long memory stays held. Default DefaultSweepInterval.
	SweepInterval time.Duration
	// Grace is the part of a counter's life after its window ends (the
	// engine's ExpireAt is the window end plus this grace). At the bound,
	// counters whose expiry is within Grace of now are reclaimed like
	// expired ones. Default 0 (only expired counters are reclaimed).
	Grace time.Duration
	// FullPolicy is what a call needing a new counter gets at the bound.
	// Default FullDeny.
	FullPolicy FullPolicy
	// MaxHolds bounds the holds one counter keeps (reservations). Default
	// DefaultMaxHolds.
	MaxHolds int
	// Now is the clock used for expiry. Default time.Now.
	Now func() time.Time
	// Ledger receives Counter.Ledger writes (the shadow-week ledger,
	// internal/ledger.Memory); nil ignores them.
	Ledger interface {
		HIncrBy(key, field string, n uint64) bool
	}
}

// Stats are cumulative counts since New, for metrics.
type Stats struct {
	Counters int64  // live counters (including expired ones not yet swept)
	Bytes    int64  // what they count against MaxBytes: keys plus CounterOverhead each
	MaxBytes int64  // the bound (Options.MaxBytes)
	Refused  uint64 // calls refused with ErrFull
	Swept    uint64 // expired counters removed
	Evicted  uint64 // counters of ended windows (expiry within Grace) reclaimed at the bound
}

// Store is the in-memory store.Store. Safe for concurrent use.
type Store struct {
	shards   []shard
	mask     uint64
	seed     maphash.Seed
	max      int64
	maxBytes int64
	now      func() time.Time
	count    atomic.Int64
	bytes    atomic.Int64 // counterBytes of every entry counted in count
	refused  atomic.Uint64
	swept    atomic.Uint64
	evicted  atomic.Uint64
	grace    int64 // ns
	maxHolds int
	fullErr  error
	sweepNow chan struct{} // asks the janitor for a full sweep at the bound
	// onExpired is ReportExpired's func.
	onExpired atomic.Pointer[func(owner any, tokens uint64)]

	ledger interface {
		HIncrBy(key, field string, n uint64) bool
	}

	closed    atomic.Bool
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

type shard struct {
	mu sync.Mutex
	m  map[string]counter
	_  [40]byte // keep shards on separate cache lines
}

type counter struct {
	value    int64
	expireAt int64  // Unix nanoseconds
	holds    *holds // reserving counters only
}

var (
	_ store.Store          = (*Store)(nil)
	_ store.ExpiryReporter = (*Store)(nil)
)

// New returns a store and starts its janitor; Close stops it.
func New(opts Options) *Store {
	if opts.MaxCounters <= 0 {
		opts.MaxCounters = DefaultMaxCounters
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Shards <= 0 {
		opts.Shards = DefaultShards
	}
	n := 1
	for n < opts.Shards {
		n <<= 1
	}
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = DefaultSweepInterval
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxHolds <= 0 {
		opts.MaxHolds = DefaultMaxHolds
	}
	s := &Store{
		maxHolds: opts.MaxHolds,
		shards:   make([]shard, n),
		mask:     uint64(n - 1),
		seed:     maphash.MakeSeed(),
		max:      int64(opts.MaxCounters),
		maxBytes: opts.MaxBytes,
		now:      opts.Now,
		stop:     make(chan struct{}),
		ledger:   opts.Ledger,
		grace:    int64(max(opts.Grace, 0)),
		fullErr:  ErrFull,
		sweepNow: make(chan struct{}, 1),
	}
	if opts.FullPolicy == FullFailurePolicy {
		s.fullErr = errFullUnavailable
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]counter)
	}
	s.wg.Add(1)
	go s.janitor(opts.SweepInterval)
	return s
}

// Stats returns cumulative counts.
func (s *Store) Stats() Stats {
	return Stats{Counters: s.count.Load(), Bytes: s.bytes.Load(), MaxBytes: s.maxBytes, Refused: s.refused.Load(), Swept: s.swept.Load(), Evicted: s.evicted.Load()}
}

// Charge implements store.Store. The whole call is atomic: every shard it
// touches is locked (in index order) for its duration, so a call is either
// applied entirely or refused entirely, and a request's holds are decided
// with every counter of the request in view.
func (s *Store) Charge(ctx context.Context, counters []store.Counter, results []store.Result) error {
	if err := ctx.Err(); err != nil {
		// Nothing applied: the caller accounts for the hits (store.ErrNotSent).
		return fmt.Errorf("%w: %w: %w", store.ErrUnavailable, store.ErrNotSent, err)
	}
	if s.closed.Load() {
		return errClosed
	}
	if err := validate(counters, results); err != nil {
		return err
	}
	if len(counters) == 0 {
		return nil
	}
	var ibuf, lbuf [8]int
	idx := ibuf[:0]
	if len(counters) > len(ibuf) {
		idx = make([]int, 0, len(counters))
	}
	for i := range counters {
		idx = append(idx, s.shardOf(counters[i].Key))
	}
	locks := lockOrder(idx, lbuf[:0])
	for _, v := range locks {
		s.shards[v].mu.Lock()
	}
	defer func() {
		for _, v := range locks {
			s.shards[v].mu.Unlock()
		}
	}()
	now := s.now().UnixNano()
	reserve, err := s.admit(counters, idx, locks, now)
	if err != nil {
		return err
	}
	var created entries
	for start := 0; start < len(counters); {
		end := start + 1
		for end < len(counters) && !counters[end].Start {
			end++
		}
		created.add(s.apply(counters[start:end], idx[start:end], results[start:end], now))
		start = end
	}
	s.count.Add(created.n - reserve.n)
	s.bytes.Add(created.bytes - reserve.bytes)
	if s.ledger != nil {
		for _, c := range counters {
			if c.Ledger.Key != "" && c.Hits > 0 {
				s.ledger.HIncrBy(c.Ledger.Key, c.Ledger.Field, c.Hits)
			}
		}
	}
	return nil
}

// counterBytes is what a counter of key counts against MaxBytes.
func counterBytes(key string) int64 { return int64(len(key)) + CounterOverhead }

// entries is a number of store entries and their counterBytes.
type entries struct{ n, bytes int64 }

func (e *entries) add(o entries) { e.n, e.bytes = e.n+o.n, e.bytes+o.bytes }

// creates reports whether counter c needs a new entry if its key has none
// live: an add, or a reserving check (its holds live in the entry).
func creates(c *store.Counter) bool { return c.Hits > 0 || (c.Hold.Reserve > 0 && c.Hits == 0) }

// admit refuses a call that would overflow a counter or needs new entries
// beyond the bound (after reclaiming expired and ended-window ones in the
// shards it holds), so a refused call changes nothing. It returns the
// entries it reserved in the count and the bytes.
func (s *Store) admit(counters []store.Counter, idx, locks []int, now int64) (entries, error) {
	var reserve entries
	var earlier map[string]uint64 // hits of earlier counters per key, for long calls
	if len(counters) > 16 {
		earlier = make(map[string]uint64, len(counters))
	}
	for i := range counters {
		c := &counters[i]
		if !creates(c) {
			continue
		}
		cur, ok := s.shards[idx[i]].m[c.Key]
		live := ok && cur.expireAt > now
		sum := c.Hits
		if live {
			sum = satAdd(sum, uint64(cur.value))
		}
		dup := false
		if earlier != nil {
			var prev uint64
			prev, dup = earlier[c.Key]
			sum = satAdd(sum, prev)
			earlier[c.Key] = satAdd(prev, c.Hits)
		} else {
			for j := range counters[:i] {
				if p := &counters[j]; p.Key == c.Key && creates(p) {
					dup = true
					sum = satAdd(sum, p.Hits)
				}
			}
		}
		if sum > math.MaxInt64 {
			// Refused whole, like a call at the counter bound: the other
			// counters may be charged on their own.
			return entries{}, fmt.Errorf("%w (%w): counter %d would overflow", store.ErrOverflow, store.ErrRefused, i)
		}
		if !live && !dup {
			reserve.add(entries{1, counterBytes(c.Key)})
		}
	}
	if reserve.n == 0 {
		return reserve, nil
	}
	n, b := s.count.Add(reserve.n), s.bytes.Add(reserve.bytes)
	if n > s.max || b > s.maxBytes {
		for _, si := range locks {
			s.reclaimLocked(&s.shards[si], now)
		}
		if s.count.Load() > s.max || s.bytes.Load() > s.maxBytes {
			s.count.Add(-reserve.n)
			s.bytes.Add(-reserve.bytes)
			s.refused.Add(1)
			select {
			case s.sweepNow <- struct{}{}: // the other shards, off this call's path
			default:
			}
			return entries{}, s.fullErr
		}
	}
	return reserve, nil
}

// apply applies one request's counters (the shards are locked): adds,
// reads, hold releases and expiries, then the request's holds if no
// enforcing counter of it is over. It returns the change in stored entries.
func (s *Store) apply(counters []store.Counter, idx []int, results []store.Result, now int64) entries {
	var delta entries
	denied := false
	for i := range counters {
		c, r := &counters[i], &results[i]
		m := s.shards[idx[i]].m
		cur, ok := m[c.Key]
		*r = store.Result{}
		if !ok || cur.expireAt <= now {
			if !creates(c) {
				continue // a check creates nothing
			}
			cur = counter{expireAt: c.ExpireAt.UnixNano()}
		}
		cur.value += int64(c.Hits)
		r.Total = uint64(cur.value)
		if c.Hold.On() {
			cur.holds = touch(cur.holds, now, c, r)
		}
		denied = denied || (c.Enforce && s.over(c, r, cur.holds))
		if cur.expireAt <= now {
			// Written with an expiry already past: gone at once, like Valkey.
			if ok {
				delete(m, c.Key)
				delta.add(entries{-1, -counterBytes(c.Key)})
			}
			continue
		}
		if !ok {
			delta.add(entries{1, counterBytes(c.Key)})
		}
		m[c.Key] = cur
	}
	if !denied {
		s.placeHolds(counters, idx, results, now)
	}
	return delta
}

// over reports whether counter c of a request with a reserving check is
// over its limit: a reserving check when total + reserved >= limit (or its
// counter keeps the most holds), any other counter when total > limit.
func (s *Store) over(c *store.Counter, r *store.Result, h *holds) bool {
	if c.Hold.Reserve > 0 && c.Hits == 0 {
		return r.Total+r.Reserved >= c.Limit || (h != nil && h.live() >= uint64(s.maxHolds))
	}
	return r.Total > c.Limit
}

// placeHolds places the holds of a request's admitted reserving checks.
func (s *Store) placeHolds(counters []store.Counter, idx []int, results []store.Result, now int64) {
	for i := range counters {
		c, r := &counters[i], &results[i]
		if c.Hold.Reserve == 0 || c.Hits != 0 || s.over(c, r, nil) {
			continue
		}
		m := s.shards[idx[i]].m
		cur, ok := m[c.Key]
		if !ok || cur.holds == nil || cur.holds.live() >= uint64(s.maxHolds) {
			continue
		}
		cur.holds.c1++
		cur.holds.t1 += c.Hold.Reserve
		r.Reserved, r.Held = cur.holds.reserved(), true
	}
}

func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// lockOrder returns the distinct shard indices of idx in ascending order, so
// concurrent multi-counter calls lock in the same order and cannot deadlock.
func lockOrder(idx, out []int) []int {
	for _, v := range idx {
		j := len(out)
		dup := false
		for k := 0; k < len(out); k++ {
			if out[k] == v {
				dup = true
				break
			}
			if out[k] > v {
				j = k
				break
			}
		}
		if dup {
			continue
		}
		out = append(out, 0)
		copy(out[j+1:], out[j:])
		out[j] = v
	}
	return out
}

func validate(counters []store.Counter, results []store.Result) error {
	if len(results) != len(counters) {
		return fmt.Errorf("charge: %d results for %d counters", len(results), len(counters))
	}
	for i, c := range counters {
		if c.Hits > math.MaxInt64 {
			return fmt.Errorf("charge: counter %d: hits %d above %d", i, c.Hits, int64(math.MaxInt64))
		}
		if (c.Hits > 0 || c.Hold.On()) && c.ExpireAt.IsZero() {
			return fmt.Errorf("charge: counter %d: zero ExpireAt would never expire", i)
		}
		if c.Hold.On() && c.Hold.Expiry <= 0 {
			return fmt.Errorf("charge: counter %d: holds need their expiry", i)
		}
	}
	return nil
}

func (s *Store) shardOf(key string) int {
	return int(maphash.String(s.seed, key) & s.mask)
}

func (s *Store) sweepLocked(sh *shard, now int64) {
	var gone entries
	for k, c := range sh.m {
		if c.expireAt <= now {
			delete(sh.m, k)
			gone.add(entries{1, counterBytes(k)})
		}
	}
	if gone.n > 0 {
		s.count.Add(-gone.n)
		s.bytes.Add(-gone.bytes)
		s.swept.Add(uint64(gone.n))
	}
}

// reclaimLocked removes sh's expired counters and, with a grace, those of
// ended windows (counted in Evicted).
func (s *Store) reclaimLocked(sh *shard, now int64) {
	if s.grace == 0 {
		s.sweepLocked(sh, now)
		return
	}
	var expired, ended, bytes int64
	for k, c := range sh.m {
		switch {
		case c.expireAt <= now:
			expired++
		case c.expireAt <= now+s.grace:
			ended++
		default:
			continue
		}
		delete(sh.m, k)
		bytes += counterBytes(k)
	}
	if expired+ended > 0 {
		s.count.Add(-(expired + ended))
		s.bytes.Add(-bytes)
		s.swept.Add(uint64(expired))
		s.evicted.Add(uint64(ended))
	}
}

// reclaim runs reclaimLocked over every shard (the janitor, when a call
// found the store full).
func (s *Store) reclaim() {
	now := s.now().UnixNano()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		s.reclaimLocked(sh, now)
		sh.mu.Unlock()
	}
}

// Sweep removes expired counters now (the janitor calls it periodically).
func (s *Store) Sweep() {
	now := s.now().UnixNano()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		s.sweepLocked(sh, now)
		sh.mu.Unlock()
	}
}

func (s *Store) janitor(every time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	var lastReclaim time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
		case <-s.sweepNow:
			// A flood keeps the store full: one full pass a second at most,
			// so refusals cost the calls nothing and the janitor one core
			// for a few ms a second.
			if time.Since(lastReclaim) >= time.Second {
				s.reclaim()
				lastReclaim = time.Now()
			}
		}
	}
}

// Close stops the janitor and waits for it. Later calls to Charge fail with
// an error wrapping store.ErrUnavailable. Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
		s.wg.Wait()
	})
	return nil
}
