// Package key encodes fixed-window counter keys.
//
// Two formats exist. Safe (the default) is unambiguous: every variable part is
// length-prefixed, so two different (domain, descriptor, window) triples never
// share a counter. Envoy is byte-identical to envoyproxy/ratelimit's
// src/limiter/cache_key.go (`<prefix><domain>_<k1>_<v1>_..._<windowStart>`),
// which is ambiguous when values contain '_' but lets a live install switch
// between the two services mid-window without resetting budgets.
package key

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// Format selects a key encoding.
type Format uint8

const (
	// Safe is the default, unambiguous encoding.
	Safe Format = iota
	// Envoy is the reference service's encoding.
	Envoy
)

// Names of the formats, as accepted by ParseFormat (KEY_FORMAT, --key-format).
const (
	NameSafe  = "safe"
	NameEnvoy = "envoy"
)

// FormatNames lists the accepted format names for help texts.
var FormatNames = []string{NameSafe, NameEnvoy}

func (f Format) String() string {
	if f == Envoy {
		return NameEnvoy
	}
	return NameSafe
}

// ParseFormat parses a format name; the empty string is Safe.
func ParseFormat(s string) (Format, error) {
	switch s {
	case "", NameSafe:
		return Safe, nil
	case NameEnvoy:
		return Envoy, nil
	}
	return Safe, fmt.Errorf("unknown key format %q (want %s or %s)", s, NameSafe, NameEnvoy)
}

// safeTag starts every Safe key after the prefix; it versions the encoding.
const safeTag = "bg1|"

// Encoder builds keys. The zero value is the Safe format with no prefix.
type Encoder struct {
	// Prefix is prepended verbatim (CACHE_KEY_PREFIX).
	Prefix string
	Format Format
}

// Append appends the key of one counter to dst. share, when non-nil, has one
// entry per descriptor entry; a non-empty one replaces that entry's value
// (share_threshold). divider is the window's length in seconds and
// windowStart its first second (internal/ratelimit/window): with epoch
// windows a multiple of the fixed divider, with calendar ones a month's
// 28-31 days or a 23- or 25-hour DST day. Start and length together name the
// window, so the Safe format never mixes two windows' counters.
func (e Encoder) Append(dst []byte, domain string, entries []*rlcommon.RateLimitDescriptor_Entry, share []string, divider, windowStart int64) []byte {
	dst = append(dst, e.Prefix...)
	if e.Format == Envoy {
		dst = append(dst, domain...)
		dst = append(dst, '_')
		for i, en := range entries {
			dst = append(dst, en.GetKey()...)
			dst = append(dst, '_')
			if v := value(en, share, i); len(v) > MaxValueBytes {
				dst = appendEnvoyDigest(dst, v) // the reference refuses it: no key to match
			} else {
				dst = append(dst, v...)
			}
			dst = append(dst, '_')
		}
		return strconv.AppendInt(dst, windowStart, 10)
	}
	dst = append(dst, safeTag...)
	dst = appendNetstring(dst, domain)
	for i, en := range entries {
		dst = appendNetstring(dst, en.GetKey())
		dst = appendValue(dst, value(en, share, i))
	}
	dst = append(dst, '@')
	dst = strconv.AppendInt(dst, divider, 10)
	dst = append(dst, '|')
	return strconv.AppendInt(dst, windowStart, 10)
}

func value(en *rlcommon.RateLimitDescriptor_Entry, share []string, i int) string {
	if i < len(share) && share[i] != "" {
		return share[i]
	}
	return en.GetValue()
}

// MaxValueBytes is the longest descriptor value a key holds as it is; a
// longer one (a principal whose identity value is huge) is counted under
// its SHA-256 digest, so a key stays bounded and the value is still counted
// (refusing it would make Envoy fail open: an unbudgeted principal).
const MaxValueBytes = 8192

// Digest names a value too long for a key: "sha256:" and the hex SHA-256.
func Digest(v string) string {
	h := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(h[:])
}

// envoyDigestMark starts a long value's digest in an Envoy-format key. The
// format writes values as they are, so a digest spelled in text could also be
// a short value ("sha256:..." sent as a header) and the two principals would
// share one counter. 0xFF is never part of valid UTF-8, and decide.Validate
// refuses a value that is not, so no value a request or a config can carry
// spells a digest key (RFC 3629, section 1: the octets C0, C1, F5 to FF never
// appear).
const envoyDigestMark = "\xff"

// appendEnvoyDigest appends a long value's digest as the Envoy format holds
// it: envoyDigestMark and Digest.
func appendEnvoyDigest(dst []byte, v string) []byte {
	h := sha256.Sum256([]byte(v))
	dst = append(dst, envoyDigestMark...)
	dst = append(dst, "sha256:"...)
	return hex.AppendEncode(dst, h[:])
}

// appendValue appends a value as a netstring, or a long one as "#" and its
// digest: no netstring starts with '#', so the two never meet.
func appendValue(dst []byte, v string) []byte {
	if len(v) <= MaxValueBytes {
		return appendNetstring(dst, v)
	}
	h := sha256.Sum256([]byte(v))
	dst = append(dst, '#')
	return hex.AppendEncode(dst, h[:])
}

func appendNetstring(dst []byte, s string) []byte {
	dst = strconv.AppendInt(dst, int64(len(s)), 10)
	dst = append(dst, ':')
	return append(dst, s...)
}

// Decoded is a Safe key taken apart.
type Decoded struct {
	Domain      string
	Entries     [][2]string // key, value
	Divider     int64
	WindowStart int64
}

// ErrMalformed is returned by Decode for a string that is not a Safe key.
var ErrMalformed = errors.New("malformed safe key")

// Decode parses a Safe key written with the given prefix. It is the inverse of
// Append and exists for tools (reports, debugging) and to prove injectivity.
func Decode(prefix, k string) (Decoded, error) {
	var d Decoded
	if len(k) < len(prefix)+len(safeTag) || k[:len(prefix)] != prefix || k[len(prefix):len(prefix)+len(safeTag)] != safeTag {
		return d, ErrMalformed
	}
	rest := k[len(prefix)+len(safeTag):]
	var parts []string
	for len(rest) > 0 && rest[0] != '@' {
		if rest[0] == '#' { // a long value's digest
			if len(rest) < 1+64 {
				return d, ErrMalformed
			}
			sum, err := hex.DecodeString(rest[1:65])
			if err != nil || hex.EncodeToString(sum) != rest[1:65] {
				return d, ErrMalformed
			}
			parts = append(parts, "sha256:"+rest[1:65])
			rest = rest[65:]
			continue
		}
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 || i > 10 || i >= len(rest) || rest[i] != ':' {
			return d, ErrMalformed
		}
		n, err := strconv.Atoi(rest[:i])
		if err != nil || (i > 1 && rest[0] == '0') || n > len(rest)-i-1 {
			return d, ErrMalformed
		}
		parts = append(parts, rest[i+1:i+1+n])
		rest = rest[i+1+n:]
	}
	if len(parts) == 0 || len(parts)%2 != 1 || len(rest) == 0 {
		return d, ErrMalformed
	}
	rest = rest[1:]
	bar := -1
	for i := 0; i < len(rest); i++ {
		if rest[i] == '|' {
			bar = i
			break
		}
	}
	if bar < 0 {
		return d, ErrMalformed
	}
	div, err1 := strconv.ParseInt(rest[:bar], 10, 64)
	ws, err2 := strconv.ParseInt(rest[bar+1:], 10, 64)
	if err1 != nil || err2 != nil || strconv.FormatInt(div, 10) != rest[:bar] || strconv.FormatInt(ws, 10) != rest[bar+1:] {
		return d, ErrMalformed
	}
	d.Domain, d.Divider, d.WindowStart = parts[0], div, ws
	for i := 1; i+1 < len(parts); i += 2 {
		d.Entries = append(d.Entries, [2]string{parts[i], parts[i+1]})
	}
	return d, nil
}
