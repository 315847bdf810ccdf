// Package valkey is the Valkey-backed store.Store: valkey-go, auto-pipelined,
// one round trip per Charge, standalone, cluster or sentinel, with TLS and ACL
// users, every hit counted exactly once.
//
// One charging path. Every call that writes goes to Valkey as one Lua script
// per slot group (script.go; one group off a cluster) carrying the call's id:
// the script sets the id's bit in a bitmap (SETBIT returns the old bit) and
// applies the adds, holds and releases only if the bit was clear. A call that
// was sent but not answered (a torn-down connection, CLIENT PAUSE WRITE, a
// black-holed link) is therefore kept in the outage buffer with its id and
// replayed until Valkey answers: its hits land exactly once whether or not
// the first send was applied (ids.go). Reads of counters no group writes are
// plain GETs; the usage ledger's increments (Counter.Ledger) ride inside the
// scripts, so they too land exactly once.
//
// Reservations. A counter with a Hold keeps its holds in a field of its
// window's hold hash (in its slot), in two generations (store.Hold): a check
// admitted by its request
// holds tokens, the request's charge releases a hold of the older generation
// first, and a generation whose holds' charges never came expires as a whole
// and is counted (store.Result.Expired). A request's holds are placed all
// or none (collect.go withdraws one slot's holds when another slot's part of
// the request was over, on a cluster).
//
// Deadlines. valkey-go queues each call in a per-connection ring (1024 slots
// by default); a call that finds the ring full waits without looking at its
// context. This store therefore runs every call in its own goroutine that
// holds one of MaxInFlight tokens (fewer than the ring's slots) until
// valkey-go really lets go of the slot, while the caller waits only until its
// own deadline (call.go). When Valkey has answered nothing for StallAfter,
// new calls are not sent into the stall but buffered (stall.go).
//
// Outage buffer. Writes that certainly did not reach Valkey (no slot before
// the deadline, a refused dial, an error reply such as LOADING or READONLY)
// are summed per key in a bounded buffer and replayed under fresh ids once
// Valkey answers again (buffer.go, replay.go). Beyond the bound, hits are
// counted lost and logged, never silently dropped. What became of every hit
// is tallied in one vocabulary (store.Tally, outcome.go); Stats is a view of
// it.
package valkey

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// Mode selects how Addresses are used.
type Mode string

// Modes.
const (
	// Standalone: one primary at Addresses[0].
	Standalone Mode = "standalone"
	// Cluster: Addresses are seed nodes of a Valkey cluster.
	Cluster Mode = "cluster"
	// Sentinel: Addresses are sentinels monitoring MasterSet.
	Sentinel Mode = "sentinel"
)

// Defaults for Options.
const (
	DefaultMode             = Standalone
	DefaultDialTimeout      = time.Second
	DefaultConnWriteTimeout = 500 * time.Millisecond
	// DefaultPingInterval is how often an idle-but-waiting connection is
	// probed; with ConnWriteTimeout it bounds how long a stalled connection is
	// kept (about 2*PingInterval + ConnWriteTimeout).
	DefaultPingInterval = time.Second
	// DefaultRingScale gives 2^10 = 1024 queue slots per connection (valkey-go's default).
	DefaultRingScale = 10
	// DefaultMaxInFlight caps calls outstanding at once; it must stay below
	// the ring size so the ring never fills.
	DefaultMaxInFlight = 256
	// DefaultBufferMaxKeys bounds the outage buffer (entries, each summed: a
	// counter key or a ledger hash field; an ambiguous call counts its ops).
	DefaultBufferMaxKeys = 100_000
	// DefaultBufferMaxBytes bounds the outage buffer's memory: the strings
	// its entries hold (counter keys, ledger fields) plus about what an entry
	// costs besides (buffer.go). At 60-byte keys the entry bound is reached
	// first (about 23 MiB).
	DefaultBufferMaxBytes = 64 << 20
	// DefaultStallAfter: with no answer from Valkey for this long since a
	// call was sent, new charges are not sent (see Options.StallAfter).
	DefaultStallAfter = 100 * time.Millisecond
	// DefaultReplayInterval is how often the outage buffer tries to replay.
	DefaultReplayInterval = 100 * time.Millisecond
	// DefaultSentinelRefresh is how often the sentinel topology is reconciled
	// in addition to +switch-master events.
	DefaultSentinelRefresh = 2 * time.Second
	// DefaultIdempotencyWindow is how long a call's id is kept in Valkey, and
	// so how long an ambiguous call may still be replayed safely.
	DefaultIdempotencyWindow = time.Minute
)

// Options configure New. The zero value of every field means its default.
type Options struct {
	// Addresses are host:port pairs: the primary (Standalone), seed nodes
	// (Cluster) or sentinels (Sentinel). Required.
	Addresses []string
	// Mode is Standalone, Cluster or Sentinel. Default Standalone.
	Mode Mode
	// MasterSet is the sentinel master set name. Required with Sentinel,
	// rejected otherwise.
	MasterSet string
	// Username and Password authenticate (ACL user, or the default user when
	// Username is empty). Never logged nor put in errors.
	Username string
	Password string
	// SentinelUsername and SentinelPassword authenticate to the sentinels
	// (Sentinel mode); empty means none.
	SentinelUsername string
	SentinelPassword string
	// TLS, when set, is used for every connection (nodes and sentinels).
	TLS *tls.Config
	// KeyPrefix starts the store's own keys (the call id bitmaps), as
	// CACHE_KEY_PREFIX starts the counters, so an ACL user limited to the
	// prefix can run the store. Default none. On a cluster it must not hold
	// a lone '{' or '}' (a hash tag would move the store's keys).
	KeyPrefix string
	// DialTimeout bounds connecting (TCP, TLS and HELLO). Default DefaultDialTimeout.
	DialTimeout time.Duration
	// ConnWriteTimeout bounds how long a connection may go without an answer
	// before it is torn down. Default DefaultConnWriteTimeout.
	ConnWriteTimeout time.Duration
	// PingInterval is the probe interval of waiting connections and the TCP
	// keep-alive. Default DefaultPingInterval.
	PingInterval time.Duration
	// PipelineMultiplex: 2^n connections per node share the auto-pipeline.
	// Zero keeps valkey-go's default (4 connections standalone/sentinel,
	// 1 per node in a cluster); negative means 1.
	PipelineMultiplex int
	// MaxFlushDelay lets the pipeline collect more commands before writing
	// (fewer syscalls, a little latency). Default 0 (off).
	MaxFlushDelay time.Duration
	// RingScale: 2^RingScale queue slots per connection. Default DefaultRingScale.
	RingScale int
	// MaxInFlight caps outstanding calls; must be below 2^RingScale.
	// Default DefaultMaxInFlight (or half the ring if that is smaller).
	MaxInFlight int
	// BufferMaxKeys bounds the outage buffer in entries. Default
	// DefaultBufferMaxKeys; negative disables the buffer (failed writes are
	// then counted lost, and ambiguous calls dropped).
	BufferMaxKeys int
	// BufferMaxBytes bounds the outage buffer's memory (see
	// DefaultBufferMaxBytes); beyond it, writes are counted lost as beyond
	// BufferMaxKeys. Default DefaultBufferMaxBytes.
	BufferMaxBytes int64
	// ReplayInterval is how often buffered writes are retried. Default
	// DefaultReplayInterval.
	ReplayInterval time.Duration
	// StallAfter: when Valkey has answered nothing for this long since a
	// call was sent to it (a stalled server: SIGSTOP, a long fork, a network
	// partition that drops without resetting; or a server that is down),
	// new calls are not handed to valkey-go but buffered at once, as
	// certainly not applied, and fail with store.ErrUnavailable. One call
	// per StallAfter goes through as a probe; its answer ends the stall.
	// Default DefaultStallAfter; negative disables.
	StallAfter time.Duration
	// ConnectInBackground makes New return a store even when Valkey cannot
	// be reached (after one attempt of at most a second; a refused password
	// or TLS handshake still fails New): it then connects in the background,
	// retrying with backoff (100 ms doubling to 5 s), and until then every
	// write is buffered as certainly not applied and fails with
	// store.ErrUnavailable, as in an outage. Default false.
	ConnectInBackground bool
	// IdempotencyWindow is how long a call's id is kept in Valkey, and so
	// how long an ambiguous call may still be replayed; an ambiguous call not
	// resolved within it is dropped and counted (AmbiguousDropped). Default
	// DefaultIdempotencyWindow.
	IdempotencyWindow time.Duration
	// MaxHolds bounds the holds one counter keeps (see DefaultMaxHolds).
	MaxHolds int
	// SentinelRefresh reconciles the sentinel topology periodically.
	// Default DefaultSentinelRefresh.
	SentinelRefresh time.Duration
	// Logger receives losses, ambiguous writes, replays and recoveries
	// (counts only: no keys, no secrets). Default slog.Default().
	Logger *slog.Logger
	// Now is the clock for buffered expiries and ids. Default time.Now.
	Now func() time.Time
}

// Client is the part of valkey-go the store uses (valkey.Client satisfies
// it), so tests can hand it a fake.
type Client interface {
	B() valkey.Builder
	DoMulti(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult
	Close()
}

// Stats are cumulative since New, for metrics: views of the store's tally
// (Tally) in the names the metrics have always had. Hits are token units.
type Stats struct {
	InFlight int64 // calls holding a slot now
	// Canceled counts hits of calls whose context was done on entry: not
	// sent, not buffered, handed back with store.ErrNotSent (the engine's
	// charger defers them: they are then Buffered too).
	Canceled uint64
	NoSlot   uint64 // calls not sent: no slot before their deadline, or Valkey stalled (Stalled)
	// NotConnected counts calls not sent because the store had not yet made
	// its first connection (ConnectInBackground); their hits are buffered.
	NotConnected uint64
	Stalled      uint64 // calls not sent because Valkey had answered nothing for StallAfter
	Applied      uint64 // hits applied and answered
	Buffered     uint64 // hits put in the outage buffer
	Replayed     uint64 // buffered hits applied to Valkey
	Lost         uint64 // hits dropped: buffer full or disabled, store closed, not a counter
	Expired      uint64 // buffered hits dropped because their window ended first
	Ambiguous    uint64 // hits sent but unanswered: kept under their call's id and replayed
	// Each ambiguous hit is resolved as one of these (or still waits): the
	// replay found the first send applied (AmbiguousApplied), the replay
	// applied it (AmbiguousReplayed), or it was given up (AmbiguousDropped:
	// maybe applied; its id window passed, the buffer was full, or the
	// store closed).
	AmbiguousApplied  uint64
	AmbiguousReplayed uint64
	AmbiguousDropped  uint64
	// AppliedOnError counts hits Valkey applied in calls that returned an
	// error to the caller (it gave up at its deadline, or another part of
	// the call failed): counted, though the caller applied its failure policy.
	AppliedOnError uint64
	BufferKeys     int64 // entries waiting in the buffer now
	// BufferBytes is what they count against BufferMaxBytes now: the
	// strings they hold plus a per-entry overhead (about their live heap).
	// BufferMaxBytes is that bound (Options.BufferMaxBytes; 0 without a
	// buffer).
	BufferBytes, BufferMaxBytes int64

	// The same for the shadow-week ledger's increments (store.Counter.Ledger),
	// in tokens: a measurement, so its failures never fail a charge.
	LedgerBuffered  uint64 // put in the outage buffer
	LedgerReplayed  uint64 // buffered and applied to Valkey
	LedgerLost      uint64 // dropped: buffer full or disabled, wrong type, closed
	LedgerExpired   uint64 // buffered, dropped because their counter expired first (its window's end plus grace)
	LedgerAmbiguous uint64 // sent but unanswered: kept with their call under its id and replayed, applied at most once
	// Each ambiguous increment is resolved as one of these (or still
	// waits), as ambiguous hits are.
	LedgerAmbiguousApplied  uint64
	LedgerAmbiguousReplayed uint64
	LedgerAmbiguousDropped  uint64
	LedgerCanceled          uint64 // handed back unsent with their hits (Canceled), then deferred with them
	LedgerAppliedOnError    uint64 // applied in calls that returned an error (AppliedOnError)

	// The same for hold releases (store.Hold.Release: a reserving budget's
	// charge releases one of its counter's holds), in releases. A release
	// lost, dropped or given up leaves its hold in place until the hold
	// expires (store.Hold.Expiry, RESERVATION_EXPIRY): never an overspend,
	// but the budget reads tighter than it is until then.
	ReleaseBuffered  uint64 // put in the outage buffer
	ReleaseReplayed  uint64 // buffered and applied to Valkey
	ReleaseLost      uint64 // dropped: buffer full or disabled, store closed
	ReleaseExpired   uint64 // buffered, dropped: their holds had certainly expired, or their counter's window ended
	ReleaseAmbiguous uint64 // sent but unanswered: kept under their call's id and replayed
	// Each ambiguous release is resolved as one of these (or still waits),
	// as ambiguous hits are; given up includes a kept call's own releases
	// whose holds had certainly expired before its replay.
	ReleaseAmbiguousApplied  uint64
	ReleaseAmbiguousReplayed uint64
	ReleaseAmbiguousDropped  uint64
	ReleaseCanceled          uint64 // handed back unsent with their hits (Canceled), then deferred with them
	ReleaseAppliedOnError    uint64 // applied in calls that returned an error (AppliedOnError)
}

// Store is the Valkey store.Store. Safe for concurrent use.
type Store struct {
	// client and b are set once, before ready is stored true (at New, or by
	// the background connector); read them only after ready.Load().
	client       Client
	b            valkey.Builder
	cmd          commands
	ready        atomic.Bool
	connected    chan struct{} // closed when ready
	slotted      bool
	notConnected atomic.Uint64

	ids         *ids
	keys        keyNames
	maxHolds    string
	stall       stallGuard
	sem         chan struct{}
	detach      time.Duration
	connWrite   time.Duration
	buf         *buffer
	log         *slog.Logger
	now         func() time.Time
	replayEvery time.Duration

	tally                store.Tally
	noSlot, stalledCalls atomic.Uint64
	onExpired            atomic.Pointer[func(owner any, tokens uint64)] // ReportExpired
	logs                 logLimits

	calls sync.Pool
	ts    atomicTS // the last counter expiry formatted
	nowTS atomicTS // the last now formatted
	dctx  atomic.Pointer[sharedCtx]

	closed atomic.Bool
	// entry is held for reading by Charge and Defer from their closed check
	// until their hits are in the buffer or their call goroutine is counted
	// in workers, and for writing by Close while it sets closed. So no hit
	// reaches the buffer after Close has drained it, and workers.Add never
	// races workers.Wait.
	entry     sync.RWMutex
	closeOnce sync.Once
	// testHookDeferred, when set (tests only), runs in Defer between its
	// closed check and its buffering: where a Close used to slip in.
	testHookDeferred func()
	stop             chan struct{}
	wg               sync.WaitGroup // replayer, connector
	workers          sync.WaitGroup // in-flight call goroutines
}

var (
	_ store.Store          = (*Store)(nil)
	_ store.ExpiryReporter = (*Store)(nil)
)

func defaults(o *Options) error {
	if o.Mode == "" {
		o.Mode = DefaultMode
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.ConnWriteTimeout <= 0 {
		o.ConnWriteTimeout = DefaultConnWriteTimeout
	}
	if o.PingInterval <= 0 {
		o.PingInterval = DefaultPingInterval
	}
	if o.RingScale <= 0 {
		o.RingScale = DefaultRingScale
	}
	ring := 1 << o.RingScale
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = min(DefaultMaxInFlight, ring/2)
	}
	if o.MaxInFlight >= ring {
		return fmt.Errorf("valkey: MaxInFlight %d must be below the ring size %d (2^RingScale)", o.MaxInFlight, ring)
	}
	if o.BufferMaxKeys == 0 {
		o.BufferMaxKeys = DefaultBufferMaxKeys
	}
	if o.BufferMaxBytes <= 0 {
		o.BufferMaxBytes = DefaultBufferMaxBytes
	}
	if o.StallAfter == 0 {
		o.StallAfter = DefaultStallAfter
	}
	if o.ReplayInterval <= 0 {
		o.ReplayInterval = DefaultReplayInterval
	}
	if o.IdempotencyWindow <= 0 {
		o.IdempotencyWindow = DefaultIdempotencyWindow
	}
	if o.MaxHolds <= 0 {
		o.MaxHolds = DefaultMaxHolds
	}
	if o.SentinelRefresh <= 0 {
		o.SentinelRefresh = DefaultSentinelRefresh
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Mode == Cluster && strings.ContainsAny(o.KeyPrefix, "{}") {
		return fmt.Errorf("valkey: key prefix %q: a '{' or '}' on a cluster would move the store's keys to another slot", o.KeyPrefix)
	}
	return nil
}

// NewWithClient returns a store over an existing client (a fake in tests).
// The store owns the client and closes it on Close.
func NewWithClient(c Client, opts Options) (*Store, error) {
	s, err := newStore(opts)
	if err != nil {
		return nil, err
	}
	s.attach(c)
	return s, nil
}

// newStore returns a store without a client, its replayer started.
func newStore(opts Options) (*Store, error) {
	if err := defaults(&opts); err != nil {
		return nil, err
	}
	cluster := opts.Mode == Cluster
	id, err := newIDs(opts.KeyPrefix, opts.IdempotencyWindow, cluster)
	if err != nil {
		return nil, err
	}
	s := &Store{
		slotted:   cluster,
		connected: make(chan struct{}),
		sem:       make(chan struct{}, opts.MaxInFlight),
		ids:       id,
		keys:      keyNames{prefix: opts.KeyPrefix, hashPrefix: opts.KeyPrefix + "bgh|", cluster: cluster},
		maxHolds:  fmt.Sprint(opts.MaxHolds),
		stall:     stallGuard{after: opts.StallAfter, epoch: time.Now()},
		// A call's goroutine waits for valkey-go to give the ring slot back:
		// a stalled connection is torn down after about 2*PingInterval +
		// ConnWriteTimeout, a reconnect takes up to DialTimeout more.
		detach:      2*opts.PingInterval + 2*opts.ConnWriteTimeout + opts.DialTimeout + time.Second,
		connWrite:   opts.ConnWriteTimeout,
		log:         opts.Logger,
		now:         opts.Now,
		replayEvery: opts.ReplayInterval,
		stop:        make(chan struct{}),
	}
	if opts.BufferMaxKeys > 0 {
		s.buf = newBuffer(opts.BufferMaxKeys, opts.BufferMaxBytes)
	}
	s.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	if s.buf != nil {
		s.wg.Add(1)
		go s.replayer()
	}
	return s, nil
}

// Connected is closed once the store has a connection to Valkey.
func (s *Store) Connected() <-chan struct{} { return s.connected }

// attach publishes the client: fields first, then ready.
func (s *Store) attach(c Client) {
	s.client = c
	s.b = c.B()
	s.cmd = commands{b: s.b, slotted: s.slotted}
	s.ready.Store(true)
	close(s.connected)
}

// Client returns the store's client (shared: never close it); nil until the
// store is connected (ConnectInBackground).
func (s *Store) Client() Client {
	if !s.ready.Load() {
		return nil
	}
	return s.client
}

// Tally returns what became of every hit, release and ledger increment the
// store was handed (store.Tally): Stats is a view of it.
func (s *Store) Tally() *store.Tally { return &s.tally }

// Stats returns cumulative counts.
func (s *Store) Stats() Stats {
	t := &s.tally
	c, l, r := store.TargetCounter, store.TargetLedger, store.TargetRelease
	st := Stats{
		InFlight:          int64(len(s.sem)),
		Canceled:          t.Get(c, store.NotSent),
		NoSlot:            s.noSlot.Load(),
		NotConnected:      s.notConnected.Load(),
		Stalled:           s.stalledCalls.Load(),
		Applied:           t.Get(c, store.Applied),
		Buffered:          t.Get(c, store.Buffered),
		Replayed:          t.Get(c, store.Replayed),
		Lost:              t.Get(c, store.Lost) + t.Get(c, store.BufferLost),
		Expired:           t.Get(c, store.Expired),
		Ambiguous:         t.Get(c, store.Ambiguous),
		AmbiguousApplied:  t.Get(c, store.AmbiguousApplied),
		AmbiguousReplayed: t.Get(c, store.AmbiguousReplayed),
		AmbiguousDropped:  t.Get(c, store.AmbiguousDropped),
		AppliedOnError:    t.Get(c, store.AppliedOnError),
		LedgerBuffered:    t.Get(l, store.Buffered),
		LedgerReplayed:    t.Get(l, store.Replayed),
		LedgerLost:        t.Get(l, store.Lost) + t.Get(l, store.BufferLost),
		LedgerExpired:     t.Get(l, store.Expired),
		LedgerAmbiguous:   t.Get(l, store.Ambiguous),

		LedgerAmbiguousApplied:  t.Get(l, store.AmbiguousApplied),
		LedgerAmbiguousReplayed: t.Get(l, store.AmbiguousReplayed),
		LedgerAmbiguousDropped:  t.Get(l, store.AmbiguousDropped),
		LedgerCanceled:          t.Get(l, store.NotSent),
		LedgerAppliedOnError:    t.Get(l, store.AppliedOnError),

		ReleaseBuffered:          t.Get(r, store.Buffered),
		ReleaseReplayed:          t.Get(r, store.Replayed),
		ReleaseLost:              t.Get(r, store.Lost) + t.Get(r, store.BufferLost),
		ReleaseExpired:           t.Get(r, store.Expired),
		ReleaseAmbiguous:         t.Get(r, store.Ambiguous),
		ReleaseAmbiguousApplied:  t.Get(r, store.AmbiguousApplied),
		ReleaseAmbiguousReplayed: t.Get(r, store.AmbiguousReplayed),
		ReleaseAmbiguousDropped:  t.Get(r, store.AmbiguousDropped),
		ReleaseCanceled:          t.Get(r, store.NotSent),
		ReleaseAppliedOnError:    t.Get(r, store.AppliedOnError),
	}
	if s.buf != nil {
		st.BufferKeys, st.BufferBytes, st.BufferMaxBytes = s.buf.size.Load(), s.buf.used.Load(), s.buf.maxBytes
	}
	return st
}

var errClosed = fmt.Errorf("%w: valkey store closed", store.ErrUnavailable)

// Close stops the replayer, waits for calls in flight (bounded by the
// connection timeouts), makes one last bounded attempt to replay the buffer
// and closes the client. What is still buffered is counted (BufferLost,
// AmbiguousDropped) and logged. Idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.entry.Lock()
		s.closed.Store(true)
		s.entry.Unlock()
		close(s.stop)
		s.wg.Wait()
		s.workers.Wait()
		if s.buf != nil && s.ready.Load() {
			for end := time.Now().Add(2 * s.connWrite); s.buf.size.Load() > 0 && time.Now().Before(end); {
				if !s.replayOnce() {
					break
				}
			}
		}
		if s.buf != nil {
			s.dropBuffer()
		}
		if s.ready.Load() {
			s.client.Close()
		}
	})
	return nil
}

// dropBuffer empties the buffer at Close, counting what it held.
func (s *Store) dropBuffer() {
	entries, groups := s.buf.drain()
	var hits, ledgerHits, amb uint64
	for _, e := range entries {
		s.resolve(e.target, e.hits, e.releases, store.BufferLost)
		if e.hash {
			ledgerHits += e.hits
		} else {
			hits += e.hits
		}
	}
	for _, g := range groups {
		s.resolveGroup(g, store.BufferLost, store.AmbiguousDropped)
		if !g.buffered {
			amb += g.hits()
		} else {
			hits += g.hits()
		}
	}
	if hits+ledgerHits+amb > 0 {
		s.log.Error("valkey store: closed with buffered writes not replayed", "lost_hits", hits, "lost_ledger_hits", ledgerHits, "ambiguous_dropped_hits", amb, "entries", len(entries), "calls", len(groups))
	}
}

// redact removes secrets from a message.
func redact(s string, opts Options) string {
	for _, secret := range []string{opts.Password, opts.SentinelPassword} {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "<redacted>")
		}
	}
	return s
}
