// Package config holds the rate limit service's configuration: the reference
// service's (envoyproxy/ratelimit) YAML format, its runtime-directory layout,
// the xDS RateLimitConfig protos, and descriptor matching that behaves exactly
// like the reference's (src/config/config_impl.go).
package config

import (
	"fmt"
	"sort"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
)

// Unit is a rate limit window unit; its values are the RLS proto's.
type Unit = rlpb.RateLimitResponse_RateLimit_Unit

// Divider returns the reference's window length in seconds of a unit
// (utils.UnitToDivider: MONTH is 30 days, YEAR 365 days), 0 for UNKNOWN or an
// out-of-range unit. Where a counter's window starts and ends is
// internal/ratelimit/window's business (calendar or epoch windows); this is
// the nominal length, used to validate units.
func Divider(u Unit) int64 { return window.Divider(window.Unit(u)) }

// RateLimit is one configured limit. It is immutable once a Config is built and
// shared by every request that matches it.
type RateLimit struct {
	// Index is the limit's position in Config.Limits(), for per-rule state.
	Index int
	// Domain is the domain that holds the limit.
	Domain string
	// Rule is the limit's stable identity for metrics and logs: the domain and
	// the config path (domain.key_value.key ...), as the reference's stats key
	// without detailed_metric. It never contains request values that the config
	// does not name, so it is safe as a metric label.
	Rule            string
	Unit            Unit
	Divider         int64
	RequestsPerUnit uint32
	Unlimited       bool
	ShadowMode      bool
	QuotaMode       bool
	DetailedMetric  bool
	Name            string
	Replaces        []string
	// Proto is the response's current_limit; shared, never mutate it.
	Proto *rlpb.RateLimitResponse_RateLimit
	// Path lists the config levels leading to the limit, from the domain's
	// top level (an empty Value is a bare key); nil for request overrides.
	Path []PathEntry
	// Scope, when set (a budget map names the limit's rule), replaces the
	// domain and descriptor in the counter key by the budget's bucket and the
	// principal, so every Gateway's rule of one budget shares one counter.
	Scope *Scope
	// Budget, when set, is what the budget map says of the limit's rule
	// (budget name, window, mode, Gateway, reservation), for metrics, the
	// ledger and reservations; nil when no budget map names the rule.
	Budget *Budget
}

// PathEntry is one level of a limit's config path.
type PathEntry struct {
	Key, Value string
}

// Scope is the counter scope of a budget's limit: counters key on (Bucket,
// principal, window) instead of (domain, descriptor, window).
type Scope struct {
	// Bucket names the budget's counter (budgetmap Entry.Bucket).
	Bucket string
	// Principal, when Fixed, is the one principal the rule counts (an
	// override's own rule, whose descriptor does not carry the value);
	// otherwise the principal is the request values matched by a bare key.
	Principal string
	Fixed     bool
}

// Budget is what the budget map says of one limit's rule. It never holds
// request values, so its fields are safe as metric labels.
type Budget struct {
	// Name is the budget's name ("frontier" for the frontier cap).
	Name string
	// Kind is budgetmap.KindTokens or KindKillSwitch.
	Kind string
	// Window is the rule's window (hour, day, week, month).
	Window string
	// Mode is "shadow" or "enforce".
	Mode string
	// Gateway names the Gateway whose policy holds the rule:
	// "<kind>:<namespace>/<name>".
	Gateway string
	// Bucket is the budget's counter scope (budgetmap Entry.Bucket).
	Bucket string
	// Measure is what the rule counts when not tokens ("ktokens", "cost").
	Measure string
	// Reserve is the rule's reservation, in the unit the rule counts; the
	// zero value is none.
	Reserve Reserve
}

// Learns names what the auto reserve of the rule learns from: its bucket's
// charges in the rule's unit.
func (b *Budget) Learns() string { return b.Bucket + "|" + b.Measure }

// Reserve is how much a check on a reserving rule holds for each admitted,
// unfinished request, in the unit the rule counts: a fixed Tokens, or Auto
// (learned from the rule's recent charges, Initial until there are enough).
type Reserve struct {
	Tokens  uint64
	Auto    bool
	Initial uint64
}

// On reports whether the rule reserves.
func (r Reserve) On() bool { return r.Tokens > 0 || r.Auto }

// Resolved is what a ScopeFunc says of one limit.
type Resolved struct {
	// Scope, when set, is the limit's budget counter scope; nil keeps the
	// limit's own counter.
	Scope *Scope
	// Budget, when set, is the budget the limit's rule implements.
	Budget *Budget
}

// ScopeFunc resolves the scope and budget of a limit from its domain and
// config path.
type ScopeFunc func(domain string, path []PathEntry) Resolved

type node struct {
	children map[string]*node
	// wildcards are the children's map keys ending in '*', in config order.
	wildcards       []string
	limit           *RateLimit
	shareThreshold  bool
	wildcardPattern string
}

// Config is a loaded set of domains. It is immutable and safe for concurrent use.
type Config struct {
	domains map[string]*node
	limits  []*RateLimit
	// Sources names the files or resources the config came from, sorted.
	sources []string
	// docs and names are what the config was built from, so it can be merged
	// with another source's config or rebuilt with new scopes.
	docs  []*Document
	names []string
	scope ScopeFunc
	// notApplied says, per place, which keys the reference gives a meaning
	// that this service accepts but does not apply.
	notApplied []string
}

// NotApplied lists the config's keys that the reference gives a meaning
// this service does not apply, one "file:line:column: field: why" each, for
// the start-up log: accepted, never silently.
func (c *Config) NotApplied() []string {
	if c == nil {
		return nil
	}
	return c.notApplied
}

// Empty reports whether the config has no domain.
func (c *Config) Empty() bool { return c == nil || len(c.domains) == 0 }

// Domains returns the domain names, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Limits returns every configured limit; RateLimit.Index indexes it.
func (c *Config) Limits() []*RateLimit {
	if c == nil {
		return nil
	}
	return c.limits
}

// Sources returns the names of the files or resources the config was built from.
func (c *Config) Sources() []string {
	if c == nil {
		return nil
	}
	return c.sources
}

// Dump renders the config for the debug endpoint, one limit per line, sorted.
func (c *Config) Dump() string {
	if c == nil {
		return ""
	}
	lines := make([]string, 0, len(c.limits))
	for _, l := range c.limits {
		lines = append(lines, fmt.Sprintf("%s: unit=%s requests_per_unit=%d, unlimited: %t, shadow_mode: %t, quota_mode: %t, name: %q, replaces: %q",
			l.Rule, l.Unit, l.RequestsPerUnit, l.Unlimited, l.ShadowMode, l.QuotaMode, l.Name, l.Replaces))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n") + "\n"
}

// Match is the result of looking up one request descriptor.
type Match struct {
	// Limit is nil when no limit applies (unknown domain, no match, or a
	// depth mismatch).
	Limit *RateLimit
	// SharePatterns, when non-nil, has one entry per request entry: a non-empty
	// string replaces that entry's value in the counter key (share_threshold).
	SharePatterns []string
	// Override is true when the limit came from the request descriptor's own
	// limit override rather than the config.
	Override bool
	// Free has bit i set when entry i (i < 64) was matched by a wildcard or a
	// bare key, so its value came from the request (a principal); the ledger
	// uses it to name the principal.
	Free uint64
}

// Lookup finds the limit for one request descriptor exactly like the
// reference: per level, "key_value" first, then the parent's wildcard keys in
// config order ("key_prefix*"), then the bare "key"; a limit applies only when
// it sits at the request's last entry. scratch is reused to build map keys
// without allocating; the grown slice is returned.
func (c *Config) Lookup(domain string, d *rlcommon.RateLimitDescriptor, scratch []byte) (Match, []byte) {
	if c == nil {
		return Match{}, scratch
	}
	root := c.domains[domain]
	if root == nil {
		return Match{}, scratch
	}
	if o := d.GetLimit(); o != nil {
		// The reference applies a request's override whenever the domain is
		// known, before matching, with no shadow mode and no name.
		u := Unit(o.GetUnit())
		// Every entry's value came from the request (nothing in the config
		// matched it), so all are Free: the ledger must not take the first
		// value as a rule name, or a caller could mint rules (and metric
		// series) at will.
		return Match{Override: true, Free: ^uint64(0), Limit: &RateLimit{
			Index: -1, Domain: domain, Rule: domain + ".override", Unit: u, Divider: Divider(u),
			RequestsPerUnit: o.GetRequestsPerUnit(),
			Proto:           &rlpb.RateLimitResponse_RateLimit{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: u},
		}}, scratch
	}
	var m Match
	cur := root
	entries := d.GetEntries()
	for i, e := range entries {
		scratch = append(scratch[:0], e.GetKey()...)
		scratch = append(scratch, '_')
		scratch = append(scratch, e.GetValue()...)
		next := cur.children[string(scratch)]
		matchedWildcard := ""
		if next == nil {
			for _, wk := range cur.wildcards {
				if strings.HasPrefix(string(scratch), wk[:len(wk)-1]) {
					next = cur.children[wk]
					matchedWildcard = wk
					break
				}
			}
		}
		if next == nil {
			next = cur.children[e.GetKey()]
			if next != nil && i < 64 {
				m.Free |= 1 << uint(i)
			}
		} else if matchedWildcard != "" && i < 64 {
			m.Free |= 1 << uint(i)
		}
		if matchedWildcard != "" && next != nil && next.shareThreshold && next.wildcardPattern != "" {
			if m.SharePatterns == nil {
				m.SharePatterns = make([]string, len(entries))
			}
			m.SharePatterns[i] = strings.TrimPrefix(next.wildcardPattern, e.GetKey()+"_")
		}
		if next != nil && next.limit != nil && i == len(entries)-1 {
			m.Limit = next.limit
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		cur = next
	}
	if m.Limit == nil {
		m.SharePatterns = nil
	}
	return m, scratch
}
