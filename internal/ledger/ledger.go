// Package ledger keeps the shadow-week measurements of token rules: per rule,
// per UTC day, each principal's usage, and per rule and day the would-be
// denials (shadow) and real denials (enforce). The rate limit service writes
// it; `budgetgen report` reads it back.
//
// Layout (Valkey; the in-memory store mirrors it):
//
//	<prefix>ledger:{<rule tag>}:<YYYYMMDD>:u   hash  field = principal, value = tokens that day
//	<prefix>ledger:{<rule tag>}:<YYYYMMDD>:d   hash  fields "shadow", "enforce" = denials that day
//
// The rule tag is escape(domain) "|" escape(rule), where escape percent-encodes
// every byte outside [A-Za-z0-9._/-]: two different (domain, rule) pairs never
// share a tag, and a tag never holds "{" or "}", so it is also the cluster hash
// tag: all days of one rule live in one slot. A principal is encoded by
// EncodePrincipal, which is injective.
//
// Cost on the charge path: one HINCRBY on the usage hash, pipelined in the
// same round trip as the counter's INCRBY (store.Counter.Ledger). Nothing else
// is sent per charge: expiries (EXPIREAT at the day's end plus the retention,
// absolute and idempotent) and denial counts are batched by a Recorder and
// written by its periodic Flush, because a denial is only known after the
// charge's reply.
package ledger

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Retention bounds, in days. Data of day D is kept until the end of D plus
// the retention, so a report run on D+8 still sees D+1..D+7 with margin.
const (
	DefaultRetentionDays = 10
	MinRetentionDays     = 8
	MaxRetentionDays     = 92
)

// Denial kinds, the fields of a day's stats hash.
const (
	FieldShadowDenials  = "shadow"
	FieldEnforceDenials = "enforce"
)

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
	// Location is the zone whose dates name the days (the service's
	// RESET_TIME_ZONE for calendar windows). Default UTC.
	Location *time.Location
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
func UsageKey(prefix string, r RuleID, d Day) string { return key(prefix, Tag(r), d, "u") }

// StatsKey is the denials hash of a rule and day.
func StatsKey(prefix string, r RuleID, d Day) string { return key(prefix, Tag(r), d, "d") }

func key(prefix, tag string, d Day, kind string) string {
	return prefix + "ledger:{" + tag + "}:" + d.Start().Format(dayLayout) + ":" + kind
}

// ErrNotLedgerKey is returned by ParseKey for keys outside the layout.
var ErrNotLedgerKey = errors.New("not a ledger key")

// ParseKey splits a usage or stats key back into its rule, day and kind
// ("u" or "d").
func ParseKey(prefix, k string) (RuleID, Day, string, error) {
	rest, ok := strings.CutPrefix(k, prefix+"ledger:{")
	if !ok {
		return RuleID{}, 0, "", ErrNotLedgerKey
	}
	tag, rest, ok := strings.Cut(rest, "}:")
	if !ok || len(rest) != len(dayLayout)+2 || rest[len(dayLayout)] != ':' {
		return RuleID{}, 0, "", ErrNotLedgerKey
	}
	t, err := time.Parse(dayLayout, rest[:len(dayLayout)])
	if err != nil {
		return RuleID{}, 0, "", ErrNotLedgerKey
	}
	kind := rest[len(dayLayout)+1:]
	if kind != "u" && kind != "d" {
		return RuleID{}, 0, "", ErrNotLedgerKey
	}
	ds, rs, ok := strings.Cut(tag, "|")
	if !ok {
		return RuleID{}, 0, "", ErrNotLedgerKey
	}
	dom, err1 := unescape(ds)
	rule, err2 := unescape(rs)
	if err1 != nil || err2 != nil {
		return RuleID{}, 0, "", ErrNotLedgerKey
	}
	return RuleID{Domain: dom, Rule: rule}, DayOf(t), kind, nil
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

// EncodePrincipal turns the identifying descriptor values of a charge (the
// values of entries matched by a bare key, e.g. a Distinct header) into a hash
// field. It is injective: no parts is "" (a shared bucket), a single plain
// value is itself, and otherwise parts are joined with "," after escaping
// "\" and "," with "\", an empty part being written "\e".
func EncodePrincipal(parts []string) string {
	if len(parts) == 1 && parts[0] != "" && !strings.ContainsAny(parts[0], `\,`) {
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
	if v != "" && !strings.ContainsAny(v, `\,`) {
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
	if len(parts) == 1 && parts[0] != "" && !strings.ContainsAny(parts[0], `\,`) && strings.ContainsAny(field, `\`) {
		return nil, fmt.Errorf("principal %q: not canonical", field)
	}
	return parts, nil
}

// PrincipalName is a principal's display name: its single value, or its
// parts joined by ", ", or "" for a shared bucket.
func PrincipalName(field string) string {
	if !strings.ContainsAny(field, `\,`) {
		return field
	}
	parts, err := DecodePrincipal(field)
	if err != nil {
		return field
	}
	return strings.Join(parts, ", ")
}
