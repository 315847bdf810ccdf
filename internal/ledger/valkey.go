package ledger

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/valkey-io/valkey-go"
)

// Defaults of the Valkey reader.
const (
	// DefaultScanCount is the COUNT hint of SCAN and HSCAN calls.
	DefaultScanCount = 1000
	// DefaultMaxKeysScanned bounds the keys a Keys call walks per node.
	DefaultMaxKeysScanned = 5_000_000
)

// Valkey is the ledger in Valkey (standalone, sentinel or cluster: keys of a
// rule share a hash tag, and Rules scans every node). It is a Sink for the
// service's Recorder and a Reader for reports.
type Valkey struct {
	client        valkey.Client
	prefix        string
	MaxPrincipals int // per rule-day; default DefaultMaxPrincipals
	MaxKeys       int // scanned per node by Keys; default DefaultMaxKeysScanned
}

// NewValkey wraps a valkey-go client (not closed by Valkey).
func NewValkey(client valkey.Client, prefix string) *Valkey {
	return &Valkey{client: client, prefix: prefix}
}

// CommandClient is what writing the ledger needs: valkey.Client and the
// counter store's client both have it.
type CommandClient interface {
	B() valkey.Builder
	DoMulti(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult
}

// NewValkeySink returns a Sink writing through c (for example the counter
// store's own client, so the service opens no second connection pool).
func NewValkeySink(c CommandClient) Sink { return valkeySink{c} }

type valkeySink struct{ c CommandClient }

func (s valkeySink) Apply(ctx context.Context, b Batch) error { return apply(ctx, s.c, b) }

// Apply implements Sink in one DoMulti: HINCRBY per deferred usage and
// denial field, EXPIREAT per key.
func (v *Valkey) Apply(ctx context.Context, b Batch) error { return apply(ctx, v.client, b) }

func apply(ctx context.Context, c CommandClient, b Batch) error {
	cmds := make(valkey.Commands, 0, len(b.Expire)+2*len(b.Denials)+len(b.Usage))
	for _, m := range []map[string]map[string]uint64{b.Usage, b.Denials} {
		for _, k := range sortedKeys(m) {
			fs := m[k]
			for _, f := range sortedKeys(fs) {
				cmds = append(cmds, c.B().Hincrby().Key(k).Field(f).Increment(int64(fs[f])).Build())
			}
		}
	}
	// Expiries after the increments so a freshly created stats hash gets one.
	for _, k := range sortedKeys(b.Expire) {
		cmds = append(cmds, c.B().Expireat().Key(k).Timestamp(b.Expire[k].Unix()).Build())
	}
	for i, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("ledger write (%d of %d commands): %w", i+1, len(cmds), err)
		}
	}
	return nil
}

// Keys implements Reader with a bounded SCAN of every node. A node with
// more than MaxKeys matching keys is scanned no further: Keys then returns
// the keys found (on it up to the bound, and on every other node) with an
// error wrapping ErrTooMany that names the node, so a caller may copy what
// was found (ledgerpg.Sync does) while memory stays bounded.
func (v *Valkey) Keys(ctx context.Context, windows []Window) ([]Key, error) {
	want := newWindowSet(windows)
	maxKeys := v.MaxKeys
	if maxKeys == 0 {
		maxKeys = DefaultMaxKeysScanned
	}
	nodes := v.client.Nodes()
	addrs := make([]string, 0, len(nodes))
	for a := range nodes {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	found := map[Key]bool{}
	var over []error
	for _, a := range addrs {
		// A replica answers SCAN too; its keys repeat the master's, and the
		// set removes duplicates.
		err := v.scanNode(ctx, nodes[a], want, maxKeys, found)
		if errors.Is(err, ErrTooMany) {
			over = append(over, fmt.Errorf("scan ledger keys on %s: %w", a, err))
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("scan ledger keys on %s: %w", a, err)
		}
	}
	return sortKeys(found), errors.Join(over...)
}

// scanNode adds the ledger keys of one node among want to found, at most
// maxKeys of them: past it, it stops with ErrTooMany.
func (v *Valkey) scanNode(ctx context.Context, n valkey.Client, want windowSet, maxKeys int, found map[Key]bool) error {
	var cursor uint64
	seen := 0
	for {
		e, err := n.Do(ctx, n.B().Scan().Cursor(cursor).Match(globQuote(v.prefix)+"ledger:{*}:*").Count(DefaultScanCount).Build()).AsScanEntry()
		if err != nil {
			return err
		}
		for _, k := range e.Elements {
			if seen++; seen > maxKeys {
				return fmt.Errorf("%w: more than %d keys match (the scan stopped there)", ErrTooMany, maxKeys)
			}
			r, w, _, err := ParseKey(v.prefix, k)
			if err == nil && want.has(w) {
				found[Key{r, w}] = true
			}
		}
		cursor = e.Cursor
		if cursor == 0 {
			return nil
		}
	}
}

// globQuote escapes the glob characters of a key prefix (the service's
// CACHE_KEY_PREFIX, which it does not restrict) for SCAN's MATCH, so a
// prefix such as "rl[eu]:" matches itself
// (https://valkey.io/commands/keys/: "Use \ to escape special characters if
// you want to match them verbatim").
func globQuote(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Read implements Reader: a bounded HSCAN of the window's usage hash and of
// its stats hash (which holds a field per principal denied, the denial
// totals and the reservation totals).
func (v *Valkey) Read(ctx context.Context, rule RuleID, w Window) (Data, error) {
	d := Data{Rule: rule, Window: w, Usage: map[string]uint64{}}
	max := v.MaxPrincipals
	if max == 0 {
		max = DefaultMaxPrincipals
	}
	uk := WindowUsageKey(v.prefix, rule, w)
	err := v.hscan(ctx, uk, max, func(f string, n uint64) { d.Usage[f] = n })
	if err == nil && len(d.Usage) > max {
		err = fmt.Errorf("hscan %s: %w: more than %d principals", uk, ErrTooMany, max)
	}
	if err != nil {
		return d, err
	}
	sk := WindowStatsKey(v.prefix, rule, w)
	// Three denial fields per principal, three denial and three reservation totals.
	// Each field is a count added into d, and HSCAN may return a field more
	// than once (https://valkey.io/commands/scan/, "Scan guarantees"): keep
	// each field once, then add.
	stats := map[string]uint64{}
	err = v.hscan(ctx, sk, 3*max+6, func(f string, n uint64) { stats[f] = n })
	for f, n := range stats {
		addStatsField(&d, f, n)
	}
	return d, err
}

// hscan walks a hash of counts, at most max fields.
func (v *Valkey) hscan(ctx context.Context, key string, max int, fn func(field string, n uint64)) error {
	var cursor uint64
	fields := 0
	for {
		e, err := v.client.Do(ctx, v.client.B().Hscan().Key(key).Cursor(cursor).Count(DefaultScanCount).Build()).AsScanEntry()
		if err != nil {
			return fmt.Errorf("hscan %s: %w", key, err)
		}
		if len(e.Elements)%2 != 0 {
			return fmt.Errorf("hscan %s: odd reply", key)
		}
		for i := 0; i < len(e.Elements); i += 2 {
			n, err := strconv.ParseUint(e.Elements[i+1], 10, 64)
			if err != nil {
				return fmt.Errorf("hscan %s field %q: not a count: %q", key, e.Elements[i], e.Elements[i+1])
			}
			fn(e.Elements[i], n)
		}
		// HSCAN may repeat a field; the bound is on what was sent.
		if fields += len(e.Elements) / 2; fields > 2*max {
			return fmt.Errorf("hscan %s: %w: more than %d fields", key, ErrTooMany, max)
		}
		cursor = e.Cursor
		if cursor == 0 {
			return nil
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// UsageCommand is the HINCRBY a store pipelines with a charge.
func UsageCommand(c valkey.Client, u Usage) valkey.Completed {
	return c.B().Hincrby().Key(u.Key).Field(u.Field).Increment(int64(u.Tokens)).Build()
}

// Add writes usage entries in one round trip, for callers that are not a
// counter store (tools, tests).
func (v *Valkey) Add(ctx context.Context, us ...Usage) error {
	cmds := make(valkey.Commands, 0, len(us))
	for _, u := range us {
		cmds = append(cmds, UsageCommand(v.client, u))
	}
	for _, r := range v.client.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return fmt.Errorf("ledger add: %w", err)
		}
	}
	return nil
}
