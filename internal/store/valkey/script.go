package valkey

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// chargeScript is every write of the store: one call per slot group of a
// store call (one call in all off a cluster), so a group's adds, holds and
// releases apply atomically and, under an id, exactly once.
//
// KEYS[1] is the call's id bitmap (any key of the slot when there is no id);
// KEYS[2..H+1] the group's hold hashes (one per window, holdHash); then
// one key per op: its counter, or a ledger hash. ARGV: [1] the id's bit
// offset, or -1 (no id: the group only reads, places holds and drops
// expired ones, which a replay never repeats); [2] the bitmap's absolute
// expiry in ms, or 0 when it is known to be set; [3] now in ms (hold
// expiries); [4] the most holds a counter keeps; [5] the group's usual
// counter expiry in ms; [6] the usual length of a hold generation in ms
// (half the holds' expiry); [7] H; [8..H+7] each hold hash's expiry in ms
// (the latest of its counters');
// [H+8] the ops' kinds, one byte per op: '.' for an op without holds, else
// 'A' + 2*(h-1) for an op on hold hash h, plus 1 when the op reads its
// counter (a check: hits 0). Then per op, its kind and arguments:
//
//	c hits              a counter's add (or read, hits 0), the usual expiry
//	C hits expiry       the same with its own expiry
//	l field             a ledger increment (the usage measurement) of the
//	                    previous op's hits: HINCRBY of the hash, answers 0
//	h hits field        a ledger increment with its own hits
//	<flags> hits [expiry] [limit] [tokens] [releases] [period]
//	                    a counter of a request with a reserving check, or
//	                    with holds
//
// Valkey turns every argument, and every argument and reply element of a
// redis.call, into a Lua or Valkey string (about a third of a microsecond
// each, more than the Lua logic of a plain add), so an op sends only the
// arguments its flags name, and holds are read and written for the whole
// group at once: 1 starts a request; 2 carries the limit; 4 enforces (over
// its limit denies the request); 8 is reservation-aware (its holds are a
// field of its hold hash named by its counter key); 16 carries its own
// expiry (else the usual); 32 carries the tokens a check holds if admitted;
// 64 how many of the counter's oldest holds to release; 128 its own
// generation length (else the usual).
//
// With an id already set (a replay of an applied call) nothing is written:
// the counters are only read. A counter's expiry is set when the add created
// it (the total equals the add): once per counter and window.
//
// A counter's holds are one field of the hold hash of its window
// (store.Hold.Window; its slot's, hash-tagged, on a cluster), named by the
// counter's key, in two generations (store.Hold), as one string of six
// little-endian doubles (struct.pack): e when the current generation ends
// (ms), p the period its holds were placed with (a changed
// RESERVATION_EXPIRY applies from the next generation), c1 and t1 its holds
// and tokens, c0 and t0 the older generation's. At e the older one expires (its tokens are returned as
// expired, once) and the current one ages into it; a period later, both (a
// hold lives at most two periods: the holds' expiry); a release takes one
// hold from the older generation first, its share of the tokens (the last
// one what is left). A field without holds is deleted, so a hash keeps only
// counters with requests in flight (or holds not yet found expired) and
// expires with its longest counter (set when missing, else only extended).
// The script reads every field it needs with one HMGET per hash and every
// counter a check reads with one MGET, before any op, and writes the changed
// fields with one HSET (and one HDEL) per hash at its end; a check reading a
// counter an earlier op of the group added to takes that add's total. A
// request's reserving checks are decided together when the request ends: if
// an enforcing op of the request is over (a reserving check is over when
// total + reserved >= limit, or when its counter already keeps the most
// holds), no hold is placed. Globals are read once into locals (a global
// read in Valkey's sandbox costs more than a local's).
//
// Returns {fresh, per op: total (0 for a ledger increment), then for flag
// 8: reserved, held (0/1), expired tokens}. A key that holds the wrong type
// yields an error element (pcall) where an op adds to it or reads it alone;
// the other ops still apply (a check's counter read with others reads such
// a key as 0, like a missing one). Lua numbers are doubles: a total from
// 2^53 up is returned as the string GET reads.
const chargeScript = `local ARGV, KEYS, redis, tonumber, math, bit, struct, string, unpack, pairs, type = ARGV, KEYS, redis, tonumber, math, bit, struct, string, unpack, pairs, type
local fresh = true
if ARGV[1] ~= '-1' then
  fresh = redis.call('SETBIT', KEYS[1], ARGV[1], 1) == 0
  if ARGV[2] ~= '0' then redis.call('PEXPIREAT', KEYS[1], ARGV[2], 'NX') end
end
local now, maxHolds, usualExp, usualPeriod = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local nh = tonumber(ARGV[7])
local kinds = ARGV[8 + nh]
local band, spack, sunpack, byte = bit.band, struct.pack, struct.unpack, string.byte
local HOLDS = '<dddddd'
local BATCH = 500
local raw, hs = {}, {}
for i = 1, nh do raw[i], hs[i] = {}, {} end
local a0, k0, nargs = 9 + nh, 2 + nh, #ARGV
local function fetch(list, hk)
  local out = {}
  for i = 1, #list, BATCH do
    local j, v = math.min(i + BATCH - 1, #list)
    if hk then v = redis.call('HMGET', hk, unpack(list, i, j)) else v = redis.call('MGET', unpack(list, i, j)) end
    for x = 1, #v do out[i + x - 1] = v[x] end
  end
  return out
end
local pre = {}
do
  local fields, rkeys, seen = {}, {}, {}
  for i = 1, nh do fields[i] = {} end
  for i = 1, #kinds do
    local b = byte(kinds, i)
    if b ~= 46 then
      local key, hi = KEYS[k0 + i - 1], math.floor((b - 65) / 2) + 1
      local r = raw[hi]
      if r[key] == nil then
        r[key] = false
        local f = fields[hi]
        f[#f + 1] = key
      end
      if (b - 65) % 2 == 1 and not seen[key] then
        seen[key] = true
        rkeys[#rkeys + 1] = key
      end
    end
  end
  for hi = 1, nh do
    local f, r = fields[hi], raw[hi]
    if #f > 0 then
      local v = fetch(f, KEYS[1 + hi])
      for i = 1, #f do r[f[i]] = v[i] end
    end
  end
  if #rkeys > 0 then
    local v = fetch(rkeys)
    for i = 1, #rkeys do pre[rkeys[i]] = v[i] or 0 end
  end
end
local out = {fresh and 1 or 0}
local n = 1
local rq, rqh, rqp, nreq, denied = {}, {}, {}, 0, false
local a, k = a0, k0
local function holds(hi, field, period)
  local hh = hs[hi]
  local h = hh[field]
  if h then return h end
  local v = raw[hi][field]
  if v then
    local e, p, c1, t1, c0, t0 = sunpack(HOLDS, v)
    h = {e = e, p = p, c1 = c1, t1 = t1, c0 = c0, t0 = t0, expired = 0}
  else
    h = {e = now + period, p = period, c1 = 0, t1 = 0, c0 = 0, t0 = 0, expired = 0}
  end
  if now >= h.e + h.p then
    h.expired, h.c0, h.t0, h.c1, h.t1, h.e, h.dirty = h.t0 + h.t1, 0, 0, 0, 0, now + period, true
  elseif now >= h.e then
    h.expired, h.c0, h.t0, h.c1, h.t1, h.e, h.dirty = h.t0, h.c1, h.t1, 0, 0, h.e + period, true
  end
  if h.p ~= period then h.p, h.dirty = period, true end
  hh[field] = h
  return h
end
local function release(h, n)
  while n > 0 do
    if h.c0 > 0 then
      if h.c0 == 1 then h.c0, h.t0 = 0, 0 else h.t0 = h.t0 - math.floor(h.t0 / h.c0); h.c0 = h.c0 - 1 end
    elseif h.c1 > 0 then
      if h.c1 == 1 then h.c1, h.t1 = 0, 0 else h.t1 = h.t1 - math.floor(h.t1 / h.c1); h.c1 = h.c1 - 1 end
    else return end
    h.dirty = true
    n = n - 1
  end
end
local function finish()
  if not denied then
    for i = 1, nreq do
      local h, p = rqh[i], rqp[i]
      h.c1, h.t1, h.dirty = h.c1 + 1, h.t1 + rq[i], true
      out[p + 1], out[p + 2] = h.t0 + h.t1, 1
    end
  end
  nreq, denied = 0, false
end
local written = {}
local function add(key, hits, exp)
  if hits == '0' or not fresh then
    local g = redis.pcall('GET', key)
    if g == false then return 0 end
    return g
  end
  local total = redis.pcall('INCRBY', key, hits)
  if type(total) == 'number' then
    if total == tonumber(hits) then redis.call('PEXPIREAT', key, exp, 'NX') end
    if total >= 9007199254740992 then
      local g = redis.call('GET', key)
      if g then total = g end
    end
  end
  written[key] = total
  return total
end
local decoded = {}
local function decode(f)
  local x = tonumber(f)
  local d = {band(x, 1) ~= 0, band(x, 2) ~= 0, band(x, 4) ~= 0, band(x, 8) ~= 0,
    band(x, 16) ~= 0, band(x, 32) ~= 0, band(x, 64) ~= 0, band(x, 128) ~= 0}
  decoded[f] = d
  return d
end
local function counterOp(f, key, hits, i)
  local d = decoded[f] or decode(f)
  if d[1] then finish() end
  local exp, limit, res, rel, period = usualExp, nil, 0, 0, usualPeriod
  if d[5] then exp = ARGV[a]; a = a + 1 end
  if d[2] then limit = tonumber(ARGV[a]); a = a + 1 end
  if d[6] then res = tonumber(ARGV[a]); a = a + 1 end
  if d[7] then rel = tonumber(ARGV[a]); a = a + 1 end
  if d[8] then period = tonumber(ARGV[a]); a = a + 1 end
  local total
  if d[4] and (hits == '0' or not fresh) then
    total = written[key]
    if total == nil then total = pre[key] end
    if total == nil then total = add(key, '0', exp) end
  else
    total = add(key, hits, exp)
  end
  n = n + 1
  local p = n
  out[p] = total
  local used = tonumber(total) or 1 / 0
  local over = limit ~= nil and used > limit
  if d[4] then
    local h = holds(math.floor((byte(kinds, i) - 65) / 2) + 1, key, period)
    if fresh then release(h, rel) end
    out[p + 1], out[p + 2], out[p + 3] = h.t0 + h.t1, 0, h.expired
    h.expired = 0
    n = n + 3
    if res > 0 then
      over = limit == nil or used + h.t0 + h.t1 >= limit or h.c0 + h.c1 >= maxHolds
      if not over then
        nreq = nreq + 1
        rq[nreq], rqh[nreq], rqp[nreq] = res, h, p
      end
    end
  end
  if over and d[3] then denied = true end
end
local function incr(key, field, hits)
  if not fresh then return 0 end
  local r = redis.pcall('HINCRBY', key, field, hits)
  if type(r) == 'number' then return 0 end
  return r
end
local last = '0'
while a <= nargs do
  local f = ARGV[a]
  local key = KEYS[k]
  k = k + 1
  if f == 'c' then
    last = ARGV[a + 1]
    n = n + 1
    out[n] = add(key, last, usualExp)
    a = a + 2
  elseif f == 'l' then
    n = n + 1
    out[n] = incr(key, ARGV[a + 1], last)
    a = a + 2
  elseif f == 'C' then
    last = ARGV[a + 1]
    n = n + 1
    out[n] = add(key, last, ARGV[a + 2])
    a = a + 3
  elseif f == 'h' then
    n = n + 1
    out[n] = incr(key, ARGV[a + 2], ARGV[a + 1])
    a = a + 3
  else
    last = ARGV[a + 1]
    a = a + 2
    counterOp(f, key, last, k - k0)
  end
end
finish()
for hi = 1, nh do
  local hk, set, del = KEYS[1 + hi], {}, {}
  for field, h in pairs(hs[hi]) do
    if h.dirty then
      if h.c0 == 0 and h.c1 == 0 then
        del[#del + 1] = field
      else
        set[#set + 1] = field
        set[#set + 1] = spack(HOLDS, h.e, h.p, h.c1, h.t1, h.c0, h.t0)
      end
    end
  end
  for i = 1, #set, 2 * BATCH do redis.call('HSET', hk, unpack(set, i, math.min(i + 2 * BATCH - 1, #set))) end
  if #set > 0 then
    redis.call('PEXPIREAT', hk, ARGV[7 + hi], 'NX')
    redis.call('PEXPIREAT', hk, ARGV[7 + hi], 'GT')
  end
  for i = 1, #del, BATCH do redis.call('HDEL', hk, unpack(del, i, math.min(i + BATCH - 1, #del))) end
end
return out
`

// unholdScript withdraws holds a request placed in one slot while another
// slot's part of it was over (a cluster only): KEYS are hold hashes, ARGV
// per key the hold's field (its counter key) and tokens. The hold is taken
// from the current generation (where it was placed; the older one if the
// generation turned since); a field left without holds is deleted.
const unholdScript = `for i = 1, #KEYS do
  local f = ARGV[2 * i - 1]
  local v = redis.call('HGET', KEYS[i], f)
  if v then
    local e, p, c1, t1, c0, t0 = struct.unpack('<dddddd', v)
    local res = tonumber(ARGV[2 * i])
    if c1 > 0 then
      c1, t1 = c1 - 1, math.max(t1 - res, 0)
    elseif c0 > 0 then
      c0, t0 = c0 - 1, math.max(t0 - res, 0)
    end
    if c0 == 0 and c1 == 0 then
      redis.call('HDEL', KEYS[i], f)
    else
      redis.call('HSET', KEYS[i], f, struct.pack('<dddddd', e, p, c1, t1, c0, t0))
    end
  end
end
return 0
`

// Op flags: the first four are also the script's (chargeScript); flagHash
// marks a ledger increment, sent as kind l or h.
const (
	flagStart   = 1
	flagLimit   = 2
	flagEnforce = 4
	flagHold    = 8
	flagHash    = 16
)

// Wire-only flags of a counter op: which optional arguments follow.
const (
	wireOwnExpiry = 16
	wireReserve   = 32
	wireRelease   = 64
	wirePeriod    = 128
)

// DefaultMaxHolds bounds the holds one counter keeps: a request that would
// need more is over its limit (a principal with that many unfinished
// requests is a runaway, and memory stays bounded).
const DefaultMaxHolds = 65536

func sha(script string) string {
	h := sha1.Sum([]byte(script))
	return hex.EncodeToString(h[:])
}

// chargeSHA names the charge script for EVALSHA; the unhold script is rare
// (a cluster request over in another slot) and sent with EVAL.
var chargeSHA = sha(chargeScript)

func noScript(r valkey.ValkeyResult) bool {
	ve, ok := valkey.IsValkeyErr(r.Error())
	return ok && ve.IsNoScript()
}

// opResult is one op's part of a script reply.
type opResult struct {
	store.Result
	err error // the counter's own error (not an integer)
}

// parseReply reads a chargeScript reply for ops (each with or without its
// hold fields) into out; it says whether the id was new.
func parseReply(r valkey.ValkeyResult, ops []op, out []opResult) (fresh bool, err error) {
	arr, err := r.ToArray()
	if err != nil {
		return false, err
	}
	want := 1
	for i := range ops {
		want += ops[i].width()
	}
	if len(arr) != want {
		return false, fmt.Errorf("%w: charge script answered %d values for %d ops (%d expected)", store.ErrMalformedReply, len(arr), len(ops), want)
	}
	f, err := arr[0].AsInt64()
	if err != nil {
		return false, fmt.Errorf("%w: charge script flag: %w", store.ErrMalformedReply, err)
	}
	j := 1
	for i := range ops {
		o := &out[i]
		*o = opResult{}
		o.Total, o.err = replyUint(arr[j])
		if ops[i].flags&flagHash != 0 {
			o.Total = 0 // a ledger increment answers 0, or its error
			j++
			continue
		}
		if ops[i].flags&flagHold != 0 {
			var held int64
			var e1, e2, e3 error
			o.Reserved, e1 = replyUint(arr[j+1])
			held, e2 = arr[j+2].AsInt64()
			o.Expired, e3 = replyUint(arr[j+3])
			if e := firstErr(e1, e2, e3); e != nil {
				return false, fmt.Errorf("%w: charge script hold fields: %w", store.ErrMalformedReply, e)
			}
			o.Held = held == 1
		}
		j += ops[i].width()
	}
	return f == 1, nil
}

func replyUint(m valkey.ValkeyMessage) (uint64, error) {
	v, err := m.AsInt64()
	switch {
	case err != nil:
		return 0, wrapErr(err)
	case v < 0:
		return 0, fmt.Errorf("%w: negative counter %d", store.ErrMalformedReply, v)
	}
	return uint64(v), nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
