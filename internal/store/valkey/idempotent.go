package valkey

import (
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// Idempotent charges (Options.Idempotent).
//
// Without them, a charge that was sent but not answered (a connection torn
// down by a stall, CLIENT PAUSE WRITE, a black-holed network) may or may not
// have been applied, so it is never re-sent: at most once. With them, the
// counters of a call go to Valkey in one Lua script (EVALSHA, EVAL once on
// NOSCRIPT) that first records the call's id (SET id 1 NX PXAT idExpiry) and
// increments only if the id is new; otherwise it only reads the counters. An
// ambiguous call is then kept in the outage buffer with its id and replayed
// with the same id until Valkey answers: the increments land exactly once,
// whether or not the first send was applied.
//
// Cluster: a script may only touch keys of one slot. The counters of a call
// are grouped by slot and each group is one script call with its own id key,
// which carries a hash tag chosen (slotTags) to hash to that same slot. So
// the id is per (call, slot); no key naming scheme of the counters is assumed.
//
// Cost: an id key per call (per slot group) lives IdempotencyWindow in
// Valkey, about 60-70 bytes of memory each (calls/s x window: 1,000 calls/s
// for 60 s is about 4 MB); an ambiguous call not resolved within the window
// (minus a margin for clock differences) is dropped and counted in
// Stats().AmbiguousDropped, since a replay could then count twice.
// The shadow-week ledger's HINCRBY (a measurement) stays outside the script.

// chargeScript: KEYS[1] the id key, KEYS[2..] counters; ARGV[1] the id key's
// absolute expiry (ms), then per counter its hits ("0": only read it) and
// absolute expiry (ms). Returns {fresh (1 or 0), total per counter}; a
// counter that is not an integer yields an error element (pcall), the others
// still apply. Lua numbers are doubles: a total from 2^53 up is returned as
// the string GET reads, so it stays exact.
const chargeScript = `local fresh = redis.call('SET', KEYS[1], '1', 'NX', 'PXAT', ARGV[1])
local out = {fresh and 1 or 0}
for i = 2, #KEYS do
  local r
  if fresh and ARGV[2*i-2] ~= '0' then
    r = redis.pcall('INCRBY', KEYS[i], ARGV[2*i-2])
    if type(r) == 'number' then
      redis.call('PEXPIREAT', KEYS[i], ARGV[2*i-1], 'NX')
      if r >= 9007199254740992 then
        local g = redis.call('GET', KEYS[i])
        if g then r = g end
      end
    end
  else
    r = redis.pcall('GET', KEYS[i])
    if r == false then r = 0 end
  end
  out[i] = r
end
return out
`

// DefaultIdempotencyWindow is how long a call's id is kept in Valkey, and so
// how long an ambiguous call can still be replayed safely.
const DefaultIdempotencyWindow = time.Minute

var chargeScriptSHA = func() string {
	h := sha1.Sum([]byte(chargeScript))
	return hex.EncodeToString(h[:])
}()

// idempotency generates call ids and builds the script calls.
type idempotency struct {
	inst   string // random per store: ids of two stores (or restarts) never meet
	seq    atomic.Uint64
	window time.Duration
	margin time.Duration // a replay is only sent this long before the id expires
	tags   []string      // cluster: a hash tag per slot; nil otherwise
}

func newIdempotency(window time.Duration, cluster bool) (*idempotency, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("valkey: idempotent charges: random id: %w", err)
	}
	id := &idempotency{inst: hex.EncodeToString(b[:]), window: window, margin: min(window/4, 5*time.Second)}
	if cluster {
		id.tags = slotTags()
	}
	return id, nil
}

// key returns a new id key for a group of counters in slot (ignored off a
// cluster).
func (id *idempotency) key(slot uint16) string {
	n := strconv.FormatUint(id.seq.Add(1), 36)
	if id.tags == nil {
		return "bgidem:" + id.inst + ":" + n
	}
	return "bgidem:{" + id.tags[slot] + "}:" + id.inst + ":" + n
}

// batch is one script call's worth of counters: the unit an id covers. It
// is also what the outage buffer keeps for an ambiguous call.
type batch struct {
	id    string // the id key
	idExp int64  // ms: when the id key expires in Valkey
	slot  uint16
	keys  []string
	hits  []uint64
	exps  []int64 // ms
	// buffered: summed from the outage buffer (hits counted in
	// Stats().Buffered, resolved into Replayed), not a call's own charges
	// (counted in Ambiguous, resolved into AmbiguousApplied/Replayed).
	buffered bool
}

func (b *batch) total() uint64 {
	var n uint64
	for _, h := range b.hits {
		n += h
	}
	return n
}

// newBatch starts a batch with a fresh id whose expiry is the window from
// now, capped by the latest counter expiry (added later with add).
func (id *idempotency) newBatch(slot uint16, now time.Time) *batch {
	return &batch{id: id.key(slot), idExp: now.Add(id.window).UnixMilli(), slot: slot}
}

func (b *batch) add(key string, hits uint64, exp int64) {
	b.keys = append(b.keys, key)
	b.hits = append(b.hits, hits)
	b.exps = append(b.exps, exp)
}

// command builds the script call (EVALSHA, or EVAL after NOSCRIPT). The id
// never outlives the latest counter it covers: past that, a replay is
// dropped as expired anyway.
func (s *Store) scriptCmd(b *batch, eval bool) valkey.Completed {
	idExp := b.idExp
	var maxExp int64
	for _, e := range b.exps {
		maxExp = max(maxExp, e)
	}
	if maxExp > 0 && maxExp < idExp {
		idExp = maxExp
	}
	b.idExp = idExp
	args := make([]string, 0, 2+1+len(b.keys)*3+1)
	if eval {
		args = append(args, chargeScript)
	} else {
		args = append(args, chargeScriptSHA)
	}
	args = append(args, strconv.Itoa(len(b.keys)+1), b.id)
	args = append(args, b.keys...)
	args = append(args, strconv.FormatInt(idExp, 10))
	for i := range b.keys {
		args = append(args, strconv.FormatUint(b.hits[i], 10), strconv.FormatInt(b.exps[i], 10))
	}
	name := "EVALSHA"
	if eval {
		name = "EVAL"
	}
	if s.cmd.slotted {
		// Keys(...) gives valkey-go the slot to route by (all keys share it).
		return s.b.Arbitrary(name).Args(args[0], args[1]).Keys(args[2 : 3+len(b.keys)]...).Args(args[3+len(b.keys):]...).Build()
	}
	return s.b.Arbitrary(name).Args(args...).Build()
}

func noScript(r valkey.ValkeyResult) bool {
	ve, ok := valkey.IsValkeyErr(r.Error())
	return ok && ve.IsNoScript()
}

// scriptReply parses a script reply: whether the id was new, and one result
// per counter (a total, or the counter's own error).
type scriptReply struct {
	fresh  bool
	totals []uint64
	errs   []error
}

func parseScriptReply(r valkey.ValkeyResult, n int) (scriptReply, error) {
	arr, err := r.ToArray()
	if err != nil {
		return scriptReply{}, err
	}
	if len(arr) != n+1 {
		return scriptReply{}, fmt.Errorf("%w: charge script answered %d values for %d counters", store.ErrMalformedReply, len(arr), n)
	}
	f, err := arr[0].AsInt64()
	if err != nil {
		return scriptReply{}, fmt.Errorf("%w: charge script flag: %w", store.ErrMalformedReply, err)
	}
	out := scriptReply{fresh: f == 1, totals: make([]uint64, n), errs: make([]error, n)}
	for i := range n {
		v, err := arr[i+1].AsInt64()
		switch {
		case err != nil:
			out.errs[i] = wrapErr(err)
		case v < 0:
			out.errs[i] = fmt.Errorf("%w: negative counter %d", store.ErrMalformedReply, v)
		default:
			out.totals[i] = uint64(v)
		}
	}
	return out, nil
}

// keySlot is the cluster slot of key (CRC16 of its hash tag, or of the whole
// key), as Valkey and valkey-go compute it.
func keySlot(key string) uint16 {
	s := 0
	for s < len(key) && key[s] != '{' {
		s++
	}
	if s < len(key) {
		e := s + 1
		for e < len(key) && key[e] != '}' {
			e++
		}
		if e < len(key) && e > s+1 {
			key = key[s+1 : e]
		}
	}
	return crc16(key) & 16383
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// slotTags returns, for each of the 16384 slots, a short string hashing to
// it (about 170,000 CRCs, a few ms, once per cluster store).
func slotTags() []string {
	tags := make([]string, 16384)
	left := len(tags)
	for i := 0; left > 0; i++ {
		t := strconv.FormatInt(int64(i), 36)
		if sl := crc16(t) & 16383; tags[sl] == "" {
			tags[sl] = t
			left--
		}
	}
	return tags
}

// buildIdempotent builds a call's commands with idempotent charges: one
// script call per slot group of charged counters first, then a GET per
// checked counter and the ledger's HINCRBYs.
func (s *Store) buildIdempotent(c *call) {
	now := s.now()
	// A checked counter goes in the script of its slot when that slot has
	// charges too (so it reads in order with them, as in the call); alone
	// it is a plain GET, creating no id.
	var charged [8]uint16
	slots := charged[:0]
	for _, k := range c.counters {
		if k.Hits > 0 {
			sl := s.slotOf(k.Key)
			if !slices.Contains(slots, sl) {
				slots = append(slots, sl)
			}
		}
	}
	for _, k := range c.counters {
		sl := s.slotOf(k.Key)
		if k.Hits == 0 && !slices.Contains(slots, sl) {
			c.pos = append(c.pos, plainGet)
			continue
		}
		bi := -1
		for n, x := range c.batches {
			if x.slot == sl {
				bi = n
				break
			}
		}
		if bi < 0 {
			bi = len(c.batches)
			c.batches = append(c.batches, s.idem.newBatch(sl, now))
		}
		b := c.batches[bi]
		c.pos = append(c.pos, uint64(bi)<<32|uint64(len(b.keys)))
		b.add(k.Key, k.Hits, k.ExpireAt.UnixMilli())
	}
	for _, b := range c.batches {
		c.cmds = append(c.cmds, s.scriptCmd(b, false))
	}
	for i, k := range c.counters {
		switch {
		case c.pos[i] == plainGet:
			c.cmds = append(c.cmds, s.cmd.get(k.Key))
		case k.Hits > 0 && k.Ledger.Key != "":
			c.cmds = append(c.cmds, s.cmd.hincrby(k.Ledger.Key, k.Ledger.Field, k.Hits))
		}
	}
}

// plainGet marks, in call.pos, a checked counter read by a plain GET.
const plainGet = math.MaxUint64

func (s *Store) slotOf(key string) uint16 {
	if s.idem.tags == nil {
		return 0
	}
	return keySlot(key)
}

// collectIdempotent is collect for buildIdempotent's commands. A script call
// that was sent but not answered is kept whole in the outage buffer with its
// id (replayed exactly once); one that certainly was not applied is summed
// into the buffer like any failed charge.
func (s *Store) collectIdempotent(c *call, res []valkey.ValkeyResult) error {
	if len(res) != len(c.cmds) {
		// Nothing is known of any command: every batch is ambiguous.
		for _, b := range c.batches {
			s.maybeSent(b.total())
			s.keepBatch(b)
		}
		return fmt.Errorf("%w: %d replies for %d commands", store.ErrMalformedReply, len(res), len(c.cmds))
	}
	replies := make([]scriptReply, len(c.batches))
	failed := make([]error, len(c.batches))
	for bi, b := range c.batches {
		rep, err := parseScriptReply(res[bi], len(b.keys))
		if err == nil {
			replies[bi] = rep
			continue
		}
		out := classify(res[bi].Error())
		if res[bi].Error() == nil {
			// The script ran but its answer is not ours: maybe applied,
			// and a replay would find its id.
			out = maybeApplied
		}
		failed[bi] = err
		switch out {
		case notApplied:
			for i, k := range b.keys {
				if b.hits[i] > 0 {
					s.bufferAdd(target{key: k}, b.hits[i], time.UnixMilli(b.exps[i]))
				}
			}
		case maybeApplied:
			s.maybeSent(b.total())
			s.keepBatch(b)
		case permanent:
			s.loss(b.total(), "valkey refused the charge script")
		}
	}
	var first error
	j := len(c.batches)
	for i, k := range c.counters {
		if c.pos[i] == plainGet {
			v, err := counterValue(res[j], true)
			j++
			if err != nil {
				first = cmp(first, fmt.Errorf("read counter %d: %w", i, err))
				continue
			}
			c.totals[i] = v
			continue
		}
		var ledgerErr error
		if k.Hits > 0 && k.Ledger.Key != "" {
			ledgerErr = res[j].Error()
			j++
		}
		bi, p := int(c.pos[i]>>32), int(c.pos[i]&0xffffffff)
		switch {
		case failed[bi] != nil:
			err := failed[bi]
			if !errors.Is(err, store.ErrMalformedReply) {
				err = wrapErr(err)
			}
			first = cmp(first, fmt.Errorf("charge counter %d: %w", i, err))
		case replies[bi].errs[p] != nil:
			s.loss(k.Hits, "the key holds something that is not a counter")
			verb := "charge"
			if k.Hits == 0 {
				verb = "read"
			}
			first = cmp(first, fmt.Errorf("%s counter %d: %w", verb, i, replies[bi].errs[p]))
		default:
			c.totals[i] = replies[bi].totals[p]
			c.applied += k.Hits
		}
		if ledgerErr != nil {
			s.ledgerFailed(ledgerTarget(k.Ledger), k.Hits, k.ExpireAt, ledgerErr)
		}
	}
	return first
}
