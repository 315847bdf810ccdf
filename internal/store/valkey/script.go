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
// then, per op, its key and, for a reservation-aware op, its hold key.
// ARGV: [1] the id's bit offset, or -1 (no id: the group only reads, places
// holds and drops expired ones, which a replay never repeats); [2] the
// bitmap's absolute expiry in ms, or 0 when it is known to be set; [3] now
// in ms (hold expiries); [4] the most holds a counter keeps; [5] the
// group's usual counter expiry in ms; [6] the usual length of a hold
// generation in ms (half the holds' expiry). Then per op, its kind and
// arguments:
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
// Valkey turns every argument into a Lua string (about a third of a
// microsecond each, more than the Lua logic of a plain add), so an op sends
// only the arguments its flags name: 1 starts a request; 2 carries the
// limit; 4 enforces (over its limit denies the request); 8 is
// reservation-aware (its hold key follows its counter in KEYS); 16 carries
// its own expiry (else the usual); 32 carries the tokens a check holds if
// admitted; 64 how many of the counter's oldest holds to release; 128 its
// own generation length (else the usual).
//
// With an id already set (a replay of an applied call) nothing is written:
// the counters are only read. A counter's expiry is set when the add created
// it (the total equals the add): once per counter and window.
//
// A hold key keeps a counter's holds in two generations (store.Hold), as
// one string of six little-endian doubles (struct.pack: one GET and one SET
// instead of a hash's six fields): e when the current generation ends (ms),
// p the period its holds were placed with (a changed RESERVATION_EXPIRY
// applies from the next generation), c1 and t1 its holds and tokens, c0 and
// t0 the older generation's. At e the older one expires (its tokens are
// returned as expired, once) and the current one ages into it; a period
// later, both (a hold lives at most two periods: the holds' expiry); a
// release takes one hold from the older generation first, its share of the
// tokens (the last one what is left). The script reads a hold key once (with
// its counter, MGET, for a check) and writes it once at its end (SET with
// the counter's expiry), whatever the number of ops on it. A request's
// reserving checks are decided together when the request ends: if an
// enforcing op of the request is over (a reserving check is over when total
// + reserved >= limit, or when its counter already keeps the most holds),
// no hold is placed.
//
// Returns {fresh, per op: total (0 for a ledger increment), then for flag
// 8: reserved, held (0/1), expired tokens}. A key that holds the wrong type
// yields an error element (pcall); the other ops still apply. Lua numbers
// are doubles: a total from 2^53 up is returned as the string GET reads.
const chargeScript = `local fresh = true
if ARGV[1] ~= '-1' then
  fresh = redis.call('SETBIT', KEYS[1], ARGV[1], 1) == 0
  if ARGV[2] ~= '0' then redis.call('PEXPIREAT', KEYS[1], ARGV[2], 'NX') end
end
local now, maxHolds, usualExp, usualPeriod = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local band, pack, unpack = bit.band, struct.pack, struct.unpack
local HOLDS = '<dddddd'
local out = {fresh and 1 or 0}
local n = 1
local rq, rqh, rqp, nreq, denied = {}, {}, {}, 0, false
local hs = {}
local a, k = 7, 2
local function holds(hk, v, period, exp)
  local h = hs[hk]
  if h then return h end
  if v == nil then v = redis.call('GET', hk) end
  if v then
    local e, p, c1, t1, c0, t0 = unpack(HOLDS, v)
    h = {e = e, p = p, c1 = c1, t1 = t1, c0 = c0, t0 = t0, expired = 0, exp = exp}
  else
    h = {e = now + period, p = period, c1 = 0, t1 = 0, c0 = 0, t0 = 0, expired = 0, exp = exp}
  end
  if now >= h.e + h.p then
    h.expired, h.c0, h.t0, h.c1, h.t1, h.e, h.dirty = h.t0 + h.t1, 0, 0, 0, 0, now + period, true
  elseif now >= h.e then
    h.expired, h.c0, h.t0, h.c1, h.t1, h.e, h.dirty = h.t0, h.c1, h.t1, 0, 0, h.e + period, true
  end
  if h.p ~= period then h.p, h.dirty = period, true end
  hs[hk] = h
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
  return total
end
local function counterOp(f, key, hits)
  if band(f, 1) ~= 0 then finish() end
  local exp, limit, res, rel, period = usualExp, nil, 0, 0, usualPeriod
  if band(f, 16) ~= 0 then exp = ARGV[a]; a = a + 1 end
  if band(f, 2) ~= 0 then limit = tonumber(ARGV[a]); a = a + 1 end
  if band(f, 32) ~= 0 then res = tonumber(ARGV[a]); a = a + 1 end
  if band(f, 64) ~= 0 then rel = tonumber(ARGV[a]); a = a + 1 end
  if band(f, 128) ~= 0 then period = tonumber(ARGV[a]); a = a + 1 end
  local total, hv
  if band(f, 8) ~= 0 and (hits == '0' or not fresh) and hs[KEYS[k]] == nil then
    local v = redis.pcall('MGET', key, KEYS[k])
    if type(v) == 'table' then
      total, hv = v[1] or 0, v[2]
    else
      total = v
    end
  else
    total = add(key, hits, exp)
  end
  n = n + 1
  local p = n
  out[p] = total
  local used = tonumber(total) or 1 / 0
  local over = limit ~= nil and used > limit
  if band(f, 8) ~= 0 then
    local hk = KEYS[k]
    k = k + 1
    local h = holds(hk, hv, period, exp)
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
  if over and band(f, 4) ~= 0 then denied = true end
end
local function incr(key, field, hits)
  if not fresh then return 0 end
  local r = redis.pcall('HINCRBY', key, field, hits)
  if type(r) == 'number' then return 0 end
  return r
end
local last, nargs = '0', #ARGV
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
    counterOp(tonumber(f), key, last)
  end
end
finish()
for hk, h in pairs(hs) do
  if h.dirty then
    redis.call('SET', hk, pack(HOLDS, h.e, h.p, h.c1, h.t1, h.c0, h.t0), 'PXAT', h.exp)
  end
end
return out
`

// unholdScript withdraws holds a request placed in one slot while another
// slot's part of it was over (a cluster only): KEYS are hold keys, ARGV per
// key the hold's tokens. The hold is taken from the current generation
// (where it was placed; the older one if the generation turned since); the
// key keeps its expiry.
const unholdScript = `for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v then
    local e, p, c1, t1, c0, t0 = struct.unpack('<dddddd', v)
    local res = tonumber(ARGV[i])
    if c1 > 0 then
      c1, t1 = c1 - 1, math.max(t1 - res, 0)
    elseif c0 > 0 then
      c0, t0 = c0 - 1, math.max(t0 - res, 0)
    end
    redis.call('SET', KEYS[i], struct.pack('<dddddd', e, p, c1, t1, c0, t0), 'KEEPTTL')
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
