package valkey

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Call ids: how a call that was sent but not answered is replayed exactly
// once.
//
// Each call that writes gets an id: a bit in a bitmap key of this store
// instance (a random name per process, so two replicas or restarts never
// share ids), one bitmap per epoch of IdempotencyWindow (per slot on a
// cluster, its key hash-tagged into that slot). The charge script sets the
// bit with SETBIT, which returns the old bit, and writes only if it was
// clear; a replay of the same call under the same id therefore writes
// nothing if the first send was applied, and everything if it was not,
// whichever reaches Valkey first. A bit costs an eighth of a byte in Valkey
// and a SETBIT on a string (the key per call of a SET NX id cost about 4x
// more server CPU, docs/benchmarks.md).
//
// A bitmap expires two windows after its epoch starts, so a call can be
// replayed for at least one window; an ambiguous call still unanswered then
// is dropped and counted (store.AmbiguousDropped), since a replay could then
// count twice.
//
// The calls carry the bitmap's expiry (PEXPIREAT NX) until one of them is
// answered, and then for expiryRecheck no call does. Valkey can lose a
// bitmap while the store believes its expiry set (FLUSHALL, a restart
// without persistence, a failover to a replica that lacked it, an eviction)
// and the next SETBIT recreates it without one; so a confirmation is trusted
// for expiryRecheck only, after which one call per slot carries the expiry
// again, and in the last expiryRecheck of an epoch (when no later call of
// the epoch may come) every call carries it. A bitmap recreated by the last
// call of its epoch that is neither within a second of a later call nor in
// the epoch's last second still stays without an expiry: one small key per
// such loss, which only a call per write could rule out.

type ids struct {
	prefix string // KeyPrefix + "bgid|" + instance + "|"
	window time.Duration
	margin time.Duration // a replay is only sent this long before its id expires
	tags   []string      // cluster: a hash tag per slot; nil otherwise
	cur    atomic.Pointer[epochIDs]
}

// expiryRecheck is how long an answer to a call that carried a bitmap's
// expiry is trusted to mean the bitmap has it.
const expiryRecheck = time.Second

// epochIDs are the id sequences of one epoch: one per slot (one off a
// cluster), when each slot's bitmap was last known to have its expiry
// (unix ms of the store's clock; 0: never), and the bitmaps' names (made
// once per epoch and slot, not per call).
type epochIDs struct {
	epoch  int64
	seq    []atomic.Int64
	expSet []atomic.Int64
	keys   []atomic.Pointer[string]
}

// idRef names one call's id.
type idRef struct {
	key     string
	off     int64
	exp     int64 // the bitmap's absolute expiry, ms
	end     int64 // the end of the id's epoch, ms
	slot    uint16
	ep      *epochIDs
	carries bool // the call's script sets the bitmap's expiry (expiryArg)
}

func newIDs(keyPrefix string, window time.Duration, cluster bool) (*ids, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("valkey: call ids: random instance: %w", err)
	}
	x := &ids{prefix: keyPrefix + "bgid|" + hex.EncodeToString(b[:]) + "|", window: window, margin: min(window/4, 5*time.Second)}
	if cluster {
		x.tags = slotTags()
	}
	return x, nil
}

// next returns a new id in slot at now.
func (x *ids) next(slot uint16, now time.Time) idRef {
	w := x.window.Milliseconds()
	e := now.UnixMilli() / w
	ep := x.cur.Load()
	for ep == nil || ep.epoch < e {
		n := len(x.tags)
		if n == 0 {
			n = 1
		}
		fresh := &epochIDs{epoch: e, seq: make([]atomic.Int64, n), expSet: make([]atomic.Int64, n), keys: make([]atomic.Pointer[string], n)}
		if x.cur.CompareAndSwap(ep, fresh) {
			ep = fresh
			break
		}
		ep = x.cur.Load()
	}
	e = ep.epoch // after a clock step back, stay in the newer epoch
	si := 0
	if x.tags != nil {
		si = int(slot)
	}
	key := ep.keys[si].Load()
	if key == nil {
		k := x.prefix + strconv.FormatInt(e, 10)
		if x.tags != nil {
			k = x.prefix + "{" + x.tags[slot] + "}" + strconv.FormatInt(e, 10)
		}
		ep.keys[si].CompareAndSwap(nil, &k)
		key = ep.keys[si].Load()
	}
	return idRef{key: *key, off: ep.seq[si].Add(1) - 1, exp: (e + 2) * w, end: (e + 1) * w, slot: slot, ep: ep}
}

// expiryArg is the bitmap expiry the script sets at now, "0" while it is
// known set (within expiryRecheck of an answer to a call that carried it)
// and the epoch's last expiryRecheck has not begun.
func (r *idRef) expiryArg(now time.Time) string {
	t, ms, recheck := r.ep.expSet[r.index()].Load(), now.UnixMilli(), expiryRecheck.Milliseconds()
	if r.carries = t == 0 || ms-t >= recheck || r.end-ms <= recheck; !r.carries {
		return "0"
	}
	return strconv.FormatInt(r.exp, 10)
}

// expiryDone records, when the call carried the bitmap's expiry and was
// answered, that the bitmap has it as of now.
func (r idRef) expiryDone(now time.Time) {
	if r.carries {
		r.ep.expSet[r.index()].Store(now.UnixMilli())
	}
}

func (r idRef) index() int {
	if len(r.ep.seq) == 1 {
		return 0
	}
	return int(r.slot)
}

// replayable reports whether a replay sent at now still finds the id.
func (x *ids) replayable(r idRef, now time.Time) bool {
	return now.Add(x.margin).UnixMilli() < r.exp
}

// keyNames derives the store's own keys.
type keyNames struct {
	prefix     string
	cluster    bool
	hashPrefix string   // prefix + "bgh|"
	hash       atomicTS // the last hold hash named off a cluster
}

// holdHash returns the hold hash of counter key k whose window ends at
// window (unix seconds, store.Hold.Window): prefix + "bgh|" + window,
// hash-tagged into k's slot on a cluster. The holds of every counter of a
// window (in a slot) share it, one field each, so one call reads and writes
// them all with one command, and it expires with its longest counter. The
// window, not the counter's expiry, names it: replicas with another expiry
// grace still share it.
func (n *keyNames) holdHash(k string, window int64, tags []string) string {
	if !n.cluster {
		return cachedMs(&n.hash, window, n.hashPrefix)
	}
	return n.prefix + "bgh|{" + tags[keySlot(k)] + "}" + strconv.FormatInt(window, 10)
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

// OwnKey reports whether key is one of the store's own keys (a call id
// bitmap or a hold hash) rather than a counter, for tools and tests that
// list a Valkey's keys; prefix is Options.KeyPrefix. Keys ending in "|hs"
// are the per-counter hold keys of earlier versions, which expire with their
// window.
func OwnKey(prefix, key string) bool {
	rest, ok := strings.CutPrefix(key, prefix)
	return ok && (strings.HasPrefix(rest, "bgid|") || strings.HasPrefix(rest, "bgh|")) || strings.HasSuffix(key, "|hs")
}
