package valkey

import (
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// op is one counter's part of a script call (chargeScript), or a buffered
// write being replayed.
type op struct {
	key      string
	holdHash string // a reservation-aware counter's hold hash (flagHold)
	field    string // a ledger increment's hash field (flagHash)
	hits     uint64
	exp      int64 // the counter's absolute expiry, ms
	flags    uint8
	limit    uint64
	reserve  uint64 // tokens a check holds if admitted
	period   int64  // a hold generation, ms (half the holds' expiry)
	releases uint64 // holds a charge releases
	// releaseBy is when the holds its releases are for have certainly
	// expired (unix ms; set once the op waits for a replay): a release
	// replayed later would take another request's hold.
	releaseBy int64
	ci        int // the counter's index in its call; -1 for a buffered write
	// owner is the counter's store.Hold.Owner (flagHold): a replay hands it
	// back with the holds it finds expired (store.ExpiryReporter).
	owner any
}

// releaseDeadline is when the holds o's releases are for have certainly
// expired (unix ms): its releaseBy once set, else a hold's life (two
// generations) after now, when o was sent, since its holds were placed
// before.
func (o *op) releaseDeadline(now time.Time) int64 {
	if o.releaseBy != 0 {
		return o.releaseBy
	}
	return now.UnixMilli() + 2*o.period
}

// width is the number of reply values of the op.
func (o *op) width() int {
	if o.flags&flagHold != 0 && o.flags&flagHash == 0 {
		return 4
	}
	return 1
}

// group is one script call: the ops of one slot, under one id when they
// write. It is also what the outage buffer keeps of an ambiguous call.
type group struct {
	slot  uint16
	id    idRef
	hasID bool
	ops   []op
	// buffered: the ops were summed from the outage buffer (their hits are
	// counted Buffered and resolve into Replayed), not a call's own writes
	// (counted Ambiguous, resolving into AmbiguousApplied or Replayed).
	buffered bool
	// unanswered: a send of the group under its id went unanswered, so it
	// may be applied: it is replayed under that id only, never summed back
	// into the buffer (a fresh id would count it twice).
	unanswered bool
}

// writes reports whether a replay of the group must keep it: it adds hits
// or releases holds (a hold not placed is never placed later: its request
// has had its answer).
func (g *group) writes() bool {
	for i := range g.ops {
		if g.ops[i].hits > 0 || g.ops[i].releases > 0 {
			return true
		}
	}
	return false
}

// hits sums the group's counter hits (not its ledger increments).
func (g *group) hits() uint64 {
	var n uint64
	for i := range g.ops {
		if g.ops[i].flags&flagHash == 0 {
			n += g.ops[i].hits
		}
	}
	return n
}

// replay returns the part of g a replay sends: its writes, without holds to
// place, limits or request starts. now is when g was sent: its releases'
// holds were placed before, so they have expired a hold's life later.
func (g *group) replay(now time.Time) *group {
	r := &group{slot: g.slot, id: g.id, hasID: g.hasID, buffered: g.buffered, unanswered: g.unanswered}
	for _, o := range g.ops {
		if o.hits == 0 && o.releases == 0 {
			continue
		}
		o.flags &= flagHold | flagHash
		o.limit, o.reserve, o.ci = 0, 0, -1
		if o.releases > 0 {
			o.releaseBy = o.releaseDeadline(now)
		}
		r.ops = append(r.ops, o)
	}
	return r
}

// plan sorts a call's counters into script groups (one per slot; one off a
// cluster), plain GETs and ledger writes. A counter goes into its slot's
// script when it writes (hits or a hold), when its request has a reserving
// check (which needs every counter's limit to decide), or when its slot has
// a script anyway (so a check reads in order with the call's writes); any
// other check is a plain GET, creating no id.
func (s *Store) plan(c *call, now time.Time) {
	var buf [8]uint16
	scripted := buf[:0] // slots with a script
	s.eachRequest(c, func(i, start int, reserving bool) {
		if k := &c.counters[i]; k.Hits > 0 || k.Hold.On() || reserving {
			if sl := s.slotOf(k.Key); !slices.Contains(scripted, sl) {
				scripted = append(scripted, sl)
			}
		}
	})
	s.eachRequest(c, func(i, start int, reserving bool) {
		k := &c.counters[i]
		c.pos[i] = -1
		if slices.Contains(scripted, s.slotOf(k.Key)) {
			s.addOp(c, i, start, reserving, now)
		} else {
			c.gets = append(c.gets, i)
		}
		if k.Hits > 0 && k.Ledger.Key != "" {
			// The measurement rides in its hash's slot group: exactly once too.
			_, g := c.groupFor(s.slotOf(k.Ledger.Key))
			g.ops = append(g.ops, op{key: k.Ledger.Key, field: k.Ledger.Field, hits: k.Hits, exp: k.ExpireAt.UnixMilli(), flags: flagHash, ci: i})
		}
	})
	for _, g := range c.groups {
		if g.writes() {
			g.id, g.hasID = s.ids.next(g.slot, now), true
		}
	}
}

// eachRequest calls f for every counter of c with the index its request
// starts at and whether the request has a reserving check.
func (s *Store) eachRequest(c *call, f func(i, start int, reserving bool)) {
	start, reserving := 0, false
	for i := range c.counters {
		if i == 0 || c.counters[i].Start {
			start, reserving = i, requestReserves(c.counters[i:])
		}
		f(i, start, reserving)
	}
}

func (s *Store) slotOf(key string) uint16 {
	if !s.slotted {
		return 0
	}
	return keySlot(key)
}

// requestReserves reports whether the request starting at counters[0] has a
// reserving check.
func requestReserves(counters []store.Counter) bool {
	for i := range counters {
		if i > 0 && counters[i].Start {
			return false
		}
		if counters[i].Hold.Reserve > 0 && counters[i].Hits == 0 {
			return true
		}
	}
	return false
}

// addOp puts counter i, of the request starting at counter start, in its
// slot's group.
func (s *Store) addOp(c *call, i, start int, withLimit bool, now time.Time) {
	k := &c.counters[i]
	gi, g := c.groupFor(s.slotOf(k.Key))
	o := op{key: k.Key, hits: k.Hits, exp: k.ExpireAt.UnixMilli(), ci: i}
	if withLimit && (len(g.ops) == 0 || g.ops[len(g.ops)-1].ci < start) {
		// Only a request with a reserving check needs its start marked:
		// its holds are decided when the next request starts.
		o.flags |= flagStart
	}
	if withLimit {
		o.flags |= flagLimit
		o.limit = k.Limit
		if k.Enforce {
			o.flags |= flagEnforce
		}
	}
	if k.Hold.On() {
		o.flags |= flagHold
		o.holdHash = s.keys.holdHash(k.Key, k.Hold.Window, s.ids.tags)
		if k.Hits == 0 {
			o.reserve = k.Hold.Reserve
		}
		o.period = max(k.Hold.Expiry.Milliseconds()/2, 1)
		o.releases, o.owner = k.Hold.Release, k.Hold.Owner
	}
	g.ops = append(g.ops, o)
	c.pos[i] = int32(gi)<<16 | int32(len(g.ops)-1)
}

// scriptCmd builds g's script call (EVALSHA, or EVAL after NOSCRIPT).
func (s *Store) scriptCmd(g *group, eval bool, now time.Time) valkey.Completed {
	// valkey-go copies the arguments into its own command: the scratch
	// slices go back to the pool once it is built.
	sc := scratchPool.Get().(*cmdScratch)
	defer scratchPool.Put(sc)
	keys, args := sc.keys[:0], sc.args[:0]
	defer func() { clear(keys); clear(args); sc.keys, sc.args = keys[:0], args[:0] }()
	if g.hasID {
		keys = append(keys, g.id.key)
		args = append(args, strconv.FormatInt(g.id.off, 10), g.id.expiryArg(now))
	} else {
		keys = append(keys, g.ops[0].key)
		args = append(args, "-1", "0")
	}
	usual, period := g.usualExpiry(), g.usualPeriod()
	args = append(args, s.nowString(now), s.maxHolds, s.msString(usual), strconv.FormatInt(period, 10))
	kinds := g.holdKinds(sc)
	args = append(args, strconv.Itoa(len(sc.hashes)))
	for i, h := range sc.hashes {
		keys = append(keys, h)
		args = append(args, s.msString(sc.hashExp[i]))
	}
	args = append(args, kinds)
	last := uint64(0) // the hits of the last counter op ("0" in the script until one)
	for i := range g.ops {
		o := &g.ops[i]
		keys = append(keys, o.key)
		args = s.appendOp(args, o, usual, period, last)
		if o.flags&flagHash == 0 {
			last = o.hits
		}
	}
	name, body := "EVALSHA", chargeSHA
	if eval {
		name, body = "EVAL", chargeScript
	}
	if s.slotted {
		// Keys(...) gives valkey-go the slot to route by (all keys share it).
		return s.b.Arbitrary(name).Args(body, strconv.Itoa(len(keys))).Keys(keys...).Args(args...).Build()
	}
	return s.b.Arbitrary(name).Args(body, strconv.Itoa(len(keys))).Args(keys...).Args(args...).Build()
}

// maxHoldHashes bounds the hold hashes of one script call: the kinds byte
// of an op names its hash from 'A' up, two values per hash. A call has one
// hash per window among its reserving counters, and a counter is only
// charged in a window not yet over, so a call has about one per window kind
// of the config: the bound is never near.
const maxHoldHashes = int(255-'A') / 2

// holdKinds lists g's hold hashes (and their expiries: the latest of their
// counters') in sc and returns the ops' kinds argument (chargeScript): '.'
// for an op without holds, else 'A' + 2*(its hash's index), plus 1 when it
// reads its counter. Past maxHoldHashes an op is sent without its holds
// (its flags say so, for the reply's shape too) rather than under another
// counter's hash.
func (g *group) holdKinds(sc *cmdScratch) string {
	sc.hashes, sc.hashExp, sc.kinds = sc.hashes[:0], sc.hashExp[:0], sc.kinds[:0]
	for i := range g.ops {
		o := &g.ops[i]
		if o.flags&flagHold == 0 || o.flags&flagHash != 0 {
			sc.kinds = append(sc.kinds, '.')
			continue
		}
		h := slices.Index(sc.hashes, o.holdHash)
		if h < 0 && len(sc.hashes) == maxHoldHashes {
			o.flags &^= flagHold
			o.reserve, o.releases = 0, 0
			sc.kinds = append(sc.kinds, '.')
			continue
		}
		if h < 0 {
			h = len(sc.hashes)
			sc.hashes, sc.hashExp = append(sc.hashes, o.holdHash), append(sc.hashExp, o.exp)
		}
		sc.hashExp[h] = max(sc.hashExp[h], o.exp)
		b := 'A' + 2*h
		if o.hits == 0 {
			b++
		}
		sc.kinds = append(sc.kinds, byte(b))
	}
	return string(sc.kinds)
}

// appendOp appends an op's kind and arguments (chargeScript): the common
// ops in their short forms, a counter op of a reserving request with only
// the arguments its flags name.
func (s *Store) appendOp(args []string, o *op, usual, period int64, last uint64) []string {
	hits := strconv.FormatUint(o.hits, 10)
	switch {
	case o.flags == flagHash && o.hits == last:
		return append(args, "l", o.field)
	case o.flags == flagHash:
		return append(args, "h", hits, o.field)
	case o.flags == 0 && o.exp == usual:
		return append(args, "c", hits)
	case o.flags == 0:
		return append(args, "C", hits, s.msString(o.exp))
	}
	wire := int(o.flags)
	var opt [5]string
	extra := opt[:0]
	if o.exp != usual {
		wire |= wireOwnExpiry
		extra = append(extra, s.msString(o.exp))
	}
	if o.flags&flagLimit != 0 {
		extra = append(extra, strconv.FormatUint(o.limit, 10))
	}
	if o.flags&flagHold != 0 {
		if o.reserve > 0 {
			wire |= wireReserve
			extra = append(extra, strconv.FormatUint(o.reserve, 10))
		}
		if o.releases > 0 {
			wire |= wireRelease
			extra = append(extra, strconv.FormatUint(o.releases, 10))
		}
		if o.period != period {
			wire |= wirePeriod
			extra = append(extra, strconv.FormatInt(o.period, 10))
		}
	}
	args = append(args, strconv.Itoa(wire), hits)
	return append(args, extra...)
}

// usualPeriod is the hold generation of the group's first
// reservation-aware op (1 when it has none): the holds of a store share
// RESERVATION_EXPIRY.
func (g *group) usualPeriod() int64 {
	for i := range g.ops {
		if g.ops[i].flags&flagHold != 0 && g.ops[i].flags&flagHash == 0 {
			return g.ops[i].period
		}
	}
	return 1
}

// usualExpiry is the expiry of the group's first counter: most counters of
// a call share their window's.
func (g *group) usualExpiry() int64 {
	for i := range g.ops {
		if g.ops[i].flags&flagHash == 0 {
			return g.ops[i].exp
		}
	}
	return 0
}

// cmdScratch is the scratch space of one script call's arguments.
type cmdScratch struct {
	keys, args []string
	hashes     []string // the call's hold hashes
	hashExp    []int64  // their expiries, ms
	kinds      []byte
}

var scratchPool = sync.Pool{New: func() any { return new(cmdScratch) }}

// tsString caches the decimal form of the last time formatted: most
// counters of a window share their expiry, and calls of one millisecond
// their now, so the hot path formats few numbers.
type tsString struct {
	ms int64
	s  string
}

type atomicTS = atomic.Pointer[tsString]

// cachedMs returns prefix + the decimal form of ms; one cache serves one
// prefix.
func cachedMs(p *atomicTS, ms int64, prefix string) string {
	if v := p.Load(); v != nil && v.ms == ms {
		return v.s
	}
	v := &tsString{ms: ms, s: prefix + strconv.FormatInt(ms, 10)}
	p.Store(v)
	return v.s
}

func (s *Store) msString(ms int64) string { return cachedMs(&s.ts, ms, "") }

func (s *Store) nowString(now time.Time) string { return cachedMs(&s.nowTS, now.UnixMilli(), "") }
