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
// then, per op, its counter and, for a reservation-aware op, its hold hash.
// ARGV: [1] the id's bit offset, or -1 (no id: the group only reads, places
// holds and drops expired ones, which a replay never repeats); [2] the
// bitmap's absolute expiry in ms, or 0 when it is known to be set; [3] now
// in ms (hold expiries); [4] the most holds a counter keeps. Then per op:
// flags, hits, the counter's absolute expiry in ms, the limit (flag 2), and
// for flag 8 the tokens a check holds if admitted, the hold's absolute expiry
// in ms and how many of the counter's oldest live holds to release.
//
// Flags: 1 starts a request; 2 carries the limit; 4 enforces (over its limit
// denies the request); 8 is reservation-aware (its hold hash follows its
// counter in KEYS); 16 is a ledger increment (the shadow-week measurement):
// its key is a hash, and instead of an expiry it carries the field to add
// the hits to (HINCRBY); it answers 0.
//
// With an id already set (a replay of an applied call) nothing is written:
// the counters are only read. A counter's expiry is set when the add created
// it (the total equals the add): once per counter and window.
//
// A hold hash has fields r (tokens held), h and t (oldest and next hold
// sequence) and one field per live hold, "<expiry ms>:<tokens>". Holds are
// released oldest first; expired ones are dropped (at most 64 a call) and
// returned. A request's reserving checks are decided together when the
// request ends: if an enforcing op of the request is over (a reserving check
// is over when total + reserved >= limit, or when its counter already keeps
// the most holds), no hold is placed.
//
// Returns {fresh, per op: total, then for flag 8: reserved, held (0/1),
// expired tokens, hold sequence (-1: none)}. A counter that is not an integer
// yields an error element (pcall); the other ops still apply. Lua numbers are
// doubles: a total from 2^53 up is returned as the string GET reads.
const chargeScript = `local fresh = true
if ARGV[1] ~= '-1' then
  fresh = redis.call('SETBIT', KEYS[1], ARGV[1], 1) == 0
  if ARGV[2] ~= '0' then redis.call('PEXPIREAT', KEYS[1], ARGV[2], 'NX') end
end
local now, maxHolds = tonumber(ARGV[3]), tonumber(ARGV[4])
local band = bit.band
local out = {fresh and 1 or 0}
local req, denied = {}, false
local a, k = 5, 2
local function finish()
  if not denied then
    for _, o in ipairs(req) do
      local seq = redis.call('HINCRBY', o.hk, 't', 1) - 1
      redis.call('HSET', o.hk, seq, o.hexp .. ':' .. o.res)
      out[o.p + 1], out[o.p + 2], out[o.p + 4] = redis.call('HINCRBY', o.hk, 'r', o.res), 1, seq
      if seq == 0 then redis.call('PEXPIREAT', o.hk, o.exp, 'NX') end
    end
  end
  req, denied = {}, false
end
local function touch(hk, release)
  local st = redis.call('HMGET', hk, 'r', 'h', 't')
  local r, h, t = tonumber(st[1]) or 0, tonumber(st[2]) or 0, tonumber(st[3]) or 0
  local h0, freed, expired, steps = h, 0, 0, 0
  while h < t and steps < 64 do
    steps = steps + 1
    local v = redis.call('HGET', hk, h)
    if v then
      local c = string.find(v, ':', 1, true)
      local e, n = tonumber(string.sub(v, 1, c - 1)), tonumber(string.sub(v, c + 1))
      if e <= now then expired = expired + n
      elseif release > 0 then release = release - 1; freed = freed + n
      else break end
      redis.call('HDEL', hk, h)
    end
    h = h + 1
  end
  if h ~= h0 then
    r = math.max(r - freed - expired, 0)
    redis.call('HSET', hk, 'r', r, 'h', h)
  end
  return r, expired, t - h
end
local function hashOp(key, field, hits)
  if not fresh then return 0 end
  local r = redis.pcall('HINCRBY', key, field, hits)
  if type(r) == 'number' then return 0 end
  return r
end
local function counterOp(f, hits, exp, key)
  if band(f, 1) ~= 0 then finish() end
  local total
  if hits ~= '0' and fresh then
    total = redis.pcall('INCRBY', key, hits)
    if type(total) == 'number' then
      if total == tonumber(hits) then redis.call('PEXPIREAT', key, exp, 'NX') end
      if total >= 9007199254740992 then
        local g = redis.call('GET', key)
        if g then total = g end
      end
    end
  else
    total = redis.pcall('GET', key)
    if total == false then total = 0 end
  end
  local p = #out + 1
  out[p] = total
  local used = tonumber(total)
  if used == nil then used = 1 / 0 end
  local limit
  if band(f, 2) ~= 0 then
    limit = tonumber(ARGV[a])
    a = a + 1
  end
  local over = limit ~= nil and used > limit
  if band(f, 8) ~= 0 then
    local hk, res, hexp, rel = KEYS[k], tonumber(ARGV[a]), ARGV[a + 1], tonumber(ARGV[a + 2])
    k, a = k + 1, a + 3
    if not fresh then rel = 0 end
    local r, expired, live = touch(hk, rel)
    out[p + 1], out[p + 2], out[p + 3], out[p + 4] = r, 0, expired, -1
    if res > 0 then
      over = limit == nil or used + r >= limit or live >= maxHolds
      if not over then req[#req + 1] = {hk = hk, res = res, hexp = hexp, exp = exp, p = p} end
    end
  end
  if over and band(f, 4) ~= 0 then denied = true end
end
while a <= #ARGV do
  local f, hits, third = tonumber(ARGV[a]), ARGV[a + 1], ARGV[a + 2]
  a = a + 3
  local key = KEYS[k]
  k = k + 1
  if band(f, 16) ~= 0 then
    out[#out + 1] = hashOp(key, third, hits)
  else
    counterOp(f, hits, third, key)
  end
end
finish()
return out
`

// unholdScript withdraws holds a request placed in one slot while another
// slot's part of it was over (a cluster only): KEYS are hold hashes, ARGV
// per key the hold's sequence and tokens. A hold already released or expired
// is left alone. Returns nothing.
const unholdScript = `for i = 1, #KEYS do
  if redis.call('HDEL', KEYS[i], ARGV[2 * i - 1]) == 1 then
    local r = redis.call('HINCRBY', KEYS[i], 'r', -tonumber(ARGV[2 * i]))
    if r < 0 then redis.call('HSET', KEYS[i], 'r', 0) end
  end
end
return 0
`

// Op flags (chargeScript).
const (
	flagStart   = 1
	flagLimit   = 2
	flagEnforce = 4
	flagHold    = 8
	flagHash    = 16
)

// DefaultMaxHolds bounds the holds one counter keeps: a request that would
// need more is over its limit (a principal with that many unfinished
// requests is a runaway, and memory stays bounded).
const DefaultMaxHolds = 65536

func sha(script string) string {
	h := sha1.Sum([]byte(script))
	return hex.EncodeToString(h[:])
}

var (
	chargeSHA = sha(chargeScript)
	unholdSHA = sha(unholdScript)
)

func noScript(r valkey.ValkeyResult) bool {
	ve, ok := valkey.IsValkeyErr(r.Error())
	return ok && ve.IsNoScript()
}

// opResult is one op's part of a script reply.
type opResult struct {
	store.Result
	seq int64 // the hold placed (-1: none)
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
		*o = opResult{seq: -1}
		o.Total, o.err = replyUint(arr[j])
		if ops[i].flags&flagHash != 0 {
			o.Total = 0 // a ledger increment answers 0, or its error
			j++
			continue
		}
		if ops[i].flags&flagHold != 0 {
			var held, seq int64
			var e1, e2, e3, e4 error
			o.Reserved, e1 = replyUint(arr[j+1])
			held, e2 = arr[j+2].AsInt64()
			o.Expired, e3 = replyUint(arr[j+3])
			seq, e4 = arr[j+4].AsInt64()
			if e := firstErr(e1, e2, e3, e4); e != nil {
				return false, fmt.Errorf("%w: charge script hold fields: %w", store.ErrMalformedReply, e)
			}
			o.Held, o.seq = held == 1, seq
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
