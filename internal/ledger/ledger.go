// Package ledger keeps the measurements of token and money rules: per rule and
// per counter window (hour, day, ISO week, calendar month), each principal's
// usage, and per rule, window and principal the would-be denials (shadow),
// real denials (enforce) and denials caused by reservations. The rate limit
// service writes it; `budgetgen report` reads it back, and `budgetgen ledger
// sync` copies it into PostgreSQL for months of history and chargeback.
//
// Layout (Valkey; the in-memory store mirrors it):
//
//	<prefix>ledger:{<rule tag>}:<window>:u   hash  field = principal, value = usage in the window
//	<prefix>ledger:{<rule tag>}:<window>:d   hash  fields "shadow", "enforce", "reserve" = the
//	                                          window's denials; "s:<principal>", "e:<principal>",
//	                                          "r:<principal>" = each principal's; "holds", "held",
//	                                          "expired" = the window's reservations (totals only)
//
// <window> is Window.ID: YYYYMMDD for a day (the layout of day-only ledgers),
// hYYYYMMDDHH for an hour (UTC), wYYYYMMDD for an ISO week (its Monday),
// mYYYYMM for a month. The rule tag is escape(domain) "|" escape(rule), where
// escape percent-encodes every byte outside [A-Za-z0-9._/-]: two different
// (domain, rule) pairs never share a tag, and a tag never holds "{" or "}",
// so it is also the cluster hash tag: all windows of one rule live in one
// slot. A principal is encoded by EncodePrincipal, which is injective.
//
// Usage counts the rule's units: tokens, thousands of tokens for a kilotoken
// rule, or 1/10,000 of the currency for a money rule (with a budget map those
// rules are named by buckets ending in #ktokens and #cost, budgetmap.Measure*).
//
// Cost on the charge path: one HINCRBY on the usage hash, pipelined in the
// same round trip as the counter's INCRBY (store.Counter.Ledger). Nothing else
// is sent per charge: expiries (EXPIREAT at the window's end plus the
// retention, absolute and idempotent) and denial counts are batched by a
// Recorder and written by its periodic Flush, because a denial is only known
// after the charge's reply.
package ledger

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	rlkey "github.com/budgetgen/budgetgen/internal/ratelimit/key"
)

// Retention bounds, in days. Data of day D is kept until the end of D plus
// the retention, so a report run on D+8 still sees D+1..D+7 with margin.
const (
	DefaultRetentionDays = 10
	MinRetentionDays     = 8
	MaxRetentionDays     = 92
)

// Denial kinds, the fields of a window's stats hash. A principal's own count
// is the kind's prefix and the principal (PrincipalDenialField).
const (
	FieldShadowDenials  = "shadow"
	FieldEnforceDenials = "enforce"
	// FieldReserveDenials counts denials the counter alone would not have
	// given: the check was over only because of the bucket's reservations.
	// Each is also a shadow or enforce denial.
	FieldReserveDenials = "reserve"
)

// Reservation fields of a window's stats hash: totals only (a hold is a
// property of the bucket's budget, not something a principal is judged on).
// Amounts are in the rule's units, like usage.
const (
	// FieldHolds counts checks admitted holding a reservation.
	FieldHolds = "holds"
	// FieldHeldUnits sums the reserve those checks held.
	FieldHeldUnits = "held"
	// FieldExpiredUnits sums the holds released because they expired before
	// their request's charge came.
	FieldExpiredUnits = "expired"
)

// principalDenialPrefix maps a total's field to its per-principal prefix.
var principalDenialPrefix = map[string]string{FieldShadowDenials: "s:", FieldEnforceDenials: "e:", FieldReserveDenials: "r:"}

// PrincipalDenialField is the stats field counting one principal's denials
// of kind (a Field*Denials constant).
func PrincipalDenialField(kind, principal string) string {
	return principalDenialPrefix[kind] + principal
}

const dayLayout = "20060102"

// RuleID names one token rule: its rate limit domain and the value of its
// first descriptor entry (Envoy Gateway: domain "<ns>/<policy>", rule
// "<ns>/<policy>/rule/<i>").
type RuleID struct {
	Domain string
	Rule   string
}

func (r RuleID) String() string { return r.Domain + " " + r.Rule }

// Day is a calendar date as days since 1970-01-01; cheap to compare and
// hash. It is the date of the service's day windows: UTC by default, the
// local date under RESET_TIME_ZONE (see DayIn).
type Day int32

// DayOf returns t's UTC day.
func DayOf(t time.Time) Day { return Day(t.Unix() / 86400) }

// DayIn returns t's date in loc (UTC when nil): the day window holding t
// when day windows follow that zone, so the ledger's day is the budget's.
func DayIn(t time.Time, loc *time.Location) Day {
	if loc == nil || loc == time.UTC {
		return DayOf(t)
	}
	y, m, d := t.In(loc).Date()
	return DayOf(time.Date(y, m, d, 0, 0, 0, 0, time.UTC))
}

// Start is the day's first instant (00:00 UTC).
func (d Day) Start() time.Time { return time.Unix(int64(d)*86400, 0).UTC() }

// String is the day as YYYY-MM-DD.
func (d Day) String() string { return d.Start().Format("2006-01-02") }

// ExpireAt is when a day's hashes expire: the day's end plus retentionDays.
func (d Day) ExpireAt(retentionDays int) time.Time {
	return d.Start().Add(time.Duration(retentionDays+1) * 24 * time.Hour)
}

// Options shared by writers and readers. The zero value is the default.
type Options struct {
	// Prefix is prepended to every key (the service's CACHE_KEY_PREFIX). Default "".
	Prefix string
	// RetentionDays keeps each day for this many days after it ends, within
	// [MinRetentionDays, MaxRetentionDays]. Default DefaultRetentionDays.
	RetentionDays int
	// Location is the zone whose dates name the day, week and month windows
	// (the service's RESET_TIME_ZONE for calendar windows). Default UTC.
	Location *time.Location
	// MaxPendingPrincipals bounds the per-principal denial counts a Recorder
	// holds between flushes. Default DefaultMaxPendingPrincipals.
	MaxPendingPrincipals int
}

// Validate checks the options and fills defaults.
func (o *Options) Validate() error {
	if o.RetentionDays == 0 {
		o.RetentionDays = DefaultRetentionDays
	}
	if o.RetentionDays < MinRetentionDays || o.RetentionDays > MaxRetentionDays {
		return fmt.Errorf("ledger retention %d days: must be within [%d, %d] (a week of shadow needs 8)", o.RetentionDays, MinRetentionDays, MaxRetentionDays)
	}
	return nil
}

// Tag returns the rule's key tag (see the package comment).
func Tag(r RuleID) string {
	var b strings.Builder
	escapeTo(&b, r.Domain)
	b.WriteByte('|')
	escapeTo(&b, r.Rule)
	return b.String()
}

// UsageKey is the usage hash of a rule and day.
func UsageKey(prefix string, r RuleID, d Day) string { return WindowUsageKey(prefix, r, DayWindow(d)) }

// StatsKey is the denials hash of a rule and day.
func StatsKey(prefix string, r RuleID, d Day) string { return WindowStatsKey(prefix, r, DayWindow(d)) }

// WindowUsageKey is the usage hash of a rule and window.
func WindowUsageKey(prefix string, r RuleID, w Window) string { return key(prefix, Tag(r), w, "u") }

// WindowStatsKey is the denials hash of a rule and window.
func WindowStatsKey(prefix string, r RuleID, w Window) string { return key(prefix, Tag(r), w, "d") }

func key(prefix, tag string, w Window, kind string) string {
	return prefix + "ledger:{" + tag + "}:" + w.keyPart() + ":" + kind
}

// ErrNotLedgerKey is returned by ParseKey for keys outside the layout.
var ErrNotLedgerKey = errors.New("not a ledger key")

// ParseKey splits a usage or stats key back into its rule, window and kind
// ("u" or "d").
func ParseKey(prefix, k string) (RuleID, Window, string, error) {
	rest, ok := strings.CutPrefix(k, prefix+"ledger:{")
	if !ok {
		return RuleID{}, Window{}, "", ErrNotLedgerKey
	}
	tag, rest, ok := strings.Cut(rest, "}:")
	if !ok || len(rest) < 3 || rest[len(rest)-2] != ':' {
		return RuleID{}, Window{}, "", ErrNotLedgerKey
	}
	w, ok := ParseWindowID(rest[:len(rest)-2])
	kind := rest[len(rest)-1:]
	if !ok || kind != "u" && kind != "d" {
		return RuleID{}, Window{}, "", ErrNotLedgerKey
	}
	ds, rs, ok := strings.Cut(tag, "|")
	if !ok {
		return RuleID{}, Window{}, "", ErrNotLedgerKey
	}
	dom, err1 := unescape(ds)
	rule, err2 := unescape(rs)
	if err1 != nil || err2 != nil {
		return RuleID{}, Window{}, "", ErrNotLedgerKey
	}
	return RuleID{Domain: dom, Rule: rule}, w, kind, nil
}

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '/' || c == '-'
}

func escapeTo(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
}

func unescape(s string) (string, error) {
	if !strings.Contains(s, "%") {
		for i := 0; i < len(s); i++ {
			if !plain(s[i]) {
				return "", ErrNotLedgerKey
			}
		}
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			if !plain(c) {
				return "", ErrNotLedgerKey
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(s) {
			return "", ErrNotLedgerKey
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil || plain(byte(v)) || strings.ToUpper(s[i+1:i+3]) != s[i+1:i+3] {
			return "", ErrNotLedgerKey
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

// digestMark starts a principal part that stands for a value too long for a
// counter key (DigestPart). 0xFF is never part of valid UTF-8, which every
// value a request sends is (decide.Validate), so no value sent is such a
// part; in a field it is written "\#sha256:<hex>", which no escaped value
// spells either. A value that spells a digest ("sha256:<hex>") is therefore
// another principal than the long value, in the ledger as in the counters.
const digestMark = "\xff"

// DigestPart is the principal part of a value too long for a counter key
// (key.MaxValueBytes): digestMark and key.Digest of the value.
func DigestPart(v string) string { return digestMark + rlkey.Digest(v) }

// isDigestPart reports whether p is a DigestPart: digestMark, "sha256:"
// and 64 lowercase hex digits.
func isDigestPart(p string) bool {
	h, ok := strings.CutPrefix(p, digestMark+"sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if (h[i] < '0' || h[i] > '9') && (h[i] < 'a' || h[i] > 'f') {
			return false
		}
	}
	return true
}

// plainPrincipal reports whether a single value is its own field.
func plainPrincipal(v string) bool {
	return v != "" && !strings.ContainsAny(v, `\,`) && !isDigestPart(v)
}

// EncodePrincipal turns the identifying descriptor values of a charge (the
// values of entries matched by a bare key, e.g. a Distinct header) into a hash
// field. It is injective: no parts is "" (a shared bucket), a single plain
// value is itself, and otherwise parts are joined with "," after escaping
// "\" and "," with "\", an empty part being written "\e" and a DigestPart
// "\#" and its digest.
func EncodePrincipal(parts []string) string {
	if len(parts) == 1 && plainPrincipal(parts[0]) {
		return parts[0]
	}
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(',')
		}
		if p == "" {
			b.WriteString(`\e`)
			continue
		}
		if isDigestPart(p) {
			b.WriteString(`\#`)
			b.WriteString(p[len(digestMark):])
			continue
		}
		for j := 0; j < len(p); j++ {
			if p[j] == '\\' || p[j] == ',' {
				b.WriteByte('\\')
			}
			b.WriteByte(p[j])
		}
	}
	return b.String()
}

// EncodePrincipal1 is EncodePrincipal of one value, without a slice.
func EncodePrincipal1(v string) string {
	if plainPrincipal(v) {
		return v
	}
	return EncodePrincipal([]string{v})
}

// DecodePrincipal reverses EncodePrincipal.
func DecodePrincipal(field string) ([]string, error) {
	if field == "" {
		return nil, nil
	}
	var parts []string
	var cur strings.Builder
	empty := false
	digests := 0 // parts written \#
	for i := 0; i < len(field); i++ {
		c := field[i]
		switch c {
		case ',':
			if cur.Len() == 0 && !empty {
				return nil, fmt.Errorf("principal %q: empty part not written as \\e", field)
			}
			parts = append(parts, cur.String())
			cur.Reset()
			empty = false
		case '\\':
			if i+1 >= len(field) {
				return nil, fmt.Errorf("principal %q: dangling escape", field)
			}
			i++
			switch field[i] {
			case '\\', ',':
				if empty {
					return nil, fmt.Errorf("principal %q: bad escape", field)
				}
				cur.WriteByte(field[i])
			case 'e':
				if cur.Len() != 0 || empty || (i+1 < len(field) && field[i+1] != ',') {
					return nil, fmt.Errorf("principal %q: \\e must be a whole part", field)
				}
				empty = true
			case '#':
				// A digest: a whole part, like \e (empty marks it closed).
				const n = len("sha256:") + 64
				d := digestMark + field[i+1:min(i+1+n, len(field))]
				if cur.Len() != 0 || empty || !isDigestPart(d) || (i+1+n < len(field) && field[i+1+n] != ',') {
					return nil, fmt.Errorf("principal %q: \\# must be a whole part: sha256: and 64 hex digits", field)
				}
				cur.WriteString(d)
				i += n
				empty = true
				digests++
			default:
				return nil, fmt.Errorf("principal %q: bad escape", field)
			}
		default:
			if empty {
				return nil, fmt.Errorf("principal %q: \\e must be a whole part", field)
			}
			cur.WriteByte(c)
		}
	}
	if cur.Len() == 0 && !empty {
		return nil, fmt.Errorf("principal %q: empty part not written as \\e", field)
	}
	parts = append(parts, cur.String())
	if len(parts) == 1 && plainPrincipal(parts[0]) && strings.ContainsAny(field, `\`) {
		return nil, fmt.Errorf("principal %q: not canonical", field)
	}
	for _, p := range parts {
		if isDigestPart(p) {
			digests--
		}
	}
	if digests != 0 {
		return nil, fmt.Errorf("principal %q: a digest not written \\#", field)
	}
	return parts, nil
}

// PrincipalName is a principal's display name: its single value, or its
// parts joined by ", ", or "" for a shared bucket; a value too long for a
// key shows as its digest, "sha256:<hex>".
func PrincipalName(field string) string {
	if !strings.ContainsAny(field, `\,`) {
		return field
	}
	parts, err := DecodePrincipal(field)
	if err != nil {
		return field
	}
	for i, p := range parts {
		if isDigestPart(p) {
			parts[i] = p[len(digestMark):]
		}
	}
	return strings.Join(parts, ", ")
}
