// Package valkey is the Valkey-backed store.Store: valkey-go, auto-pipelined,
// one round trip per Charge (INCRBY per charged counter, with PEXPIREAT NX
// unless the counter's expiry is known to be set (expiryCache), and GET per
// checked counter, all in one DoMulti), standalone, cluster or sentinel, with
// TLS and ACL users. A day's counter charged all day thus costs one command
// per charge, not two.
//
// Deadlines. valkey-go queues each call in a per-connection ring (1024 slots by
// default) and a call that finds the ring full waits for a free slot without
// looking at its context; a call that times out keeps its slot until the server
// answers or the connection is torn down. Under a burst while Valkey stalls the
// ring fills and later calls block for seconds. This store therefore runs every
// call in its own goroutine that holds one of MaxInFlight tokens (fewer than
// the ring's slots) until valkey-go really lets go of the slot, while the caller
// waits only until its own deadline. A caller that finds no token before its
// deadline returns store.ErrUnavailable at once; nothing is queued behind a
// stalled server beyond MaxInFlight calls.
//
// Outage buffer. Charges that certainly did not reach Valkey (no token before
// the deadline, connection refused, an error reply such as LOADING or READONLY)
// are summed per key in a bounded buffer and replayed (INCRBY + PEXPIREAT NX)
// once Valkey answers again, with the charges' ledger increments
// (Counter.Ledger, summed per hash and field, HINCRBY in the same batch;
// counted apart in Stats().Ledger*). A charge that was sent but not answered
// (the connection broke, the call timed out) may or may not have been applied:
// a stalled server executes what is in its socket when it resumes. Those charges
// are never re-sent, to avoid counting them twice; they are counted in
// Stats().Ambiguous and logged. With Options.Idempotent each call carries an
// id recorded by a Lua script (idempotent.go), and ambiguous calls are
// replayed under their id: counted exactly once. With
// Options.ConnectInBackground an unreachable Valkey at start is an outage
// like any other (buffered until the first connection). Beyond the buffer's bound the lost hits are
// counted in Stats().Lost and logged, never silently dropped.
package valkey

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
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
	// counter key or a ledger hash field).
	DefaultBufferMaxKeys = 100_000
	// DefaultStallAfter: with no answer from Valkey for this long since a
	// call was sent, new charges are not sent (see Options.StallAfter).
	DefaultStallAfter = 100 * time.Millisecond
	// DefaultKnownExpiries bounds the counters remembered as having their
	// expiry set (about 100-150 bytes each).
	DefaultKnownExpiries = 200_000
	// DefaultReplayInterval is how often the outage buffer tries to replay.
	DefaultReplayInterval = 100 * time.Millisecond
	// DefaultSentinelRefresh is how often the sentinel topology is reconciled
	// in addition to +switch-master events.
	DefaultSentinelRefresh = 2 * time.Second
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
	// BufferMaxKeys bounds the outage buffer in entries (counter keys and
	// ledger hash fields). Default DefaultBufferMaxKeys;
	// negative disables the buffer (failed charges are then only counted in
	// Stats().Lost). A service that denies on store errors may prefer that,
	// since a denied request consumed nothing.
	BufferMaxKeys int
	// ReplayInterval is how often buffered charges are retried. Default
	// DefaultReplayInterval.
	ReplayInterval time.Duration
	// KnownExpiries bounds the counters remembered as having their expiry
	// set, whose charges then skip PEXPIREAT NX. Default
	// DefaultKnownExpiries; negative sends PEXPIREAT NX with every charge.
	KnownExpiries int
	// StallAfter: when Valkey has answered nothing for this long since a
	// call was sent to it (a stalled server: SIGSTOP, a long fork, a network
	// partition that drops without resetting; or a server that is down),
	// new charges are not handed to valkey-go but buffered at once, as
	// certainly not applied, and the call fails with store.ErrUnavailable.
	// Sent into a stalled connection they would be ambiguous (maybe applied
	// when the server resumes, never re-sent) and, with the ring full, late.
	// One call per StallAfter goes through as a probe; its answer ends the
	// stall. Default DefaultStallAfter; negative disables.
	StallAfter time.Duration
	// ConnectInBackground makes New return a store even when Valkey cannot
	// be reached (after one attempt of at most a second; a refused password
	// or TLS handshake still fails New): it then connects
	// in the background, retrying with backoff (100 ms doubling to 5 s),
	// and until then every charge is buffered as certainly not applied
	// (Stats().NotConnected) and fails with store.ErrUnavailable, as in an
	// outage. Connected() tells when it is connected. Default false: New
	// fails if the first connection cannot be made.
	ConnectInBackground bool
	// Idempotent sends every call's charges through one Lua script that
	// records the call's id and increments only if the id is new (per slot
	// in a cluster; see idempotent.go), so a call sent but unanswered is
	// kept in the outage buffer with its id and replayed until it is known
	// to be counted exactly once, instead of being counted at most once.
	// Default false (docs/benchmarks.md has its cost).
	Idempotent bool
	// IdempotencyWindow is how long a call's id is kept in Valkey, and so
	// how long an ambiguous call may still be replayed. Default
	// DefaultIdempotencyWindow. Only with Idempotent.
	IdempotencyWindow time.Duration
	// SentinelRefresh reconciles the sentinel topology periodically.
	// Default DefaultSentinelRefresh.
	SentinelRefresh time.Duration
	// Logger receives buffer losses, ambiguous charges and replays (counts
	// only: no keys, no secrets). Default slog.Default().
	Logger *slog.Logger
	// Now is the clock for buffered expiries. Default time.Now.
	Now func() time.Time
}

// Client is the part of valkey-go the store uses (valkey.Client satisfies
// it), so tests can hand it a fake.
type Client interface {
	B() valkey.Builder
	DoMulti(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult
	Close()
}

// Stats are cumulative since New, for metrics. Hits are token units.
type Stats struct {
	InFlight int64 // calls holding a slot now
	// Canceled counts hits of calls whose context was done on entry: not
	// sent, not buffered, handed back to the caller with store.ErrNotSent
	// (the engine's charger defers them: they are then Buffered too).
	Canceled uint64
	NoSlot   uint64 // calls not sent: no slot before their deadline, or Valkey stalled (Stalled)
	// NotConnected counts calls not sent because the store had not yet
	// made its first connection (ConnectInBackground); their hits are
	// buffered.
	NotConnected uint64
	Stalled      uint64 // calls not sent because Valkey had answered nothing for StallAfter
	Buffered     uint64 // hits put in the outage buffer
	Replayed     uint64 // buffered hits applied to Valkey
	Lost         uint64 // hits dropped because the buffer was full or disabled
	Expired      uint64 // buffered hits dropped because their window ended first
	Ambiguous    uint64 // hits sent but unanswered: maybe applied (re-sent only with Idempotent)
	// With Idempotent, each ambiguous hit is then resolved as one of these
	// (or is still buffered): the replay found the first send applied
	// (AmbiguousApplied), the replay applied it (AmbiguousReplayed), or it
	// was given up (AmbiguousDropped: maybe applied; its id window passed,
	// the buffer was full, or the store closed).
	AmbiguousApplied  uint64
	AmbiguousReplayed uint64
	AmbiguousDropped  uint64
	// AppliedOnError counts hits Valkey applied in calls that returned an
	// error to the caller (it gave up at its deadline, or another command of
	// the call failed): counted, though the caller applied its failure policy.
	AppliedOnError uint64
	BufferKeys     int64 // entries waiting in the buffer now (counter keys and ledger fields)

	// The same for the shadow-week ledger's increments (store.Counter.Ledger),
	// in tokens: a measurement, so its failures never fail a charge.
	LedgerBuffered  uint64 // put in the outage buffer
	LedgerReplayed  uint64 // buffered and applied to Valkey
	LedgerLost      uint64 // dropped: buffer full or disabled, wrong type, closed
	LedgerExpired   uint64 // buffered, dropped because their counter's window ended first
	LedgerAmbiguous uint64 // sent but unanswered: maybe applied, never re-sent
}

// Store is the Valkey store.Store. Safe for concurrent use.
type Store struct {
	// client, b and cmd are set once, before ready is stored true (at New,
	// or by the background connector); read them only after ready.Load().
	client       Client
	b            valkey.Builder
	cmd          commands
	ready        atomic.Bool
	connected    chan struct{} // closed when ready
	slotted      bool
	notConnected atomic.Uint64
	known        *expiryCache // nil when disabled
	idem         *idempotency // nil unless Options.Idempotent
	stallAfter   time.Duration

	// Stall detection, in monotonic ns since epoch (a wall-clock step must
	// not wedge the guard): when the first call sent since Valkey's last
	// answer was sent (0: none, or answered since), and when the last probe
	// was let through a stall.
	epoch                      time.Time
	unansweredSince, lastProbe atomic.Int64
	stallRefused               atomic.Uint64
	sem                        chan struct{}
	detach                     time.Duration
	connWrite                  time.Duration
	buf                        *buffer
	log                        *slog.Logger
	now                        func() time.Time
	replayEvery                time.Duration

	calls sync.Pool
	ts    atomic.Pointer[tsString]
	dctx  atomic.Pointer[sharedCtx]

	closed atomic.Bool
	// entry is held for reading by Charge and Defer from their closed check
	// until their hits are in the buffer or their call goroutine is counted
	// in workers, and for writing by Close while it sets closed. So no hit
	// reaches the buffer after Close has drained it (such hits would be
	// counted Buffered and never replayed nor Lost), and workers.Add never
	// races workers.Wait.
	entry     sync.RWMutex
	closeOnce sync.Once
	// testHookDeferred, when set (tests only), runs in Defer between its
	// closed check and its buffering: where a Close used to slip in.
	testHookDeferred func()
	stop             chan struct{}
	wg               sync.WaitGroup // replayer
	workers          sync.WaitGroup // in-flight call goroutines

	noSlot, buffered, replayed, lost, expired, ambiguous, appliedOnErr, canceled atomic.Uint64
	ledgerBuffered, ledgerReplayed, ledgerLost, ledgerExpired, ledgerAmbiguous   atomic.Uint64
	ambiguousApplied, ambiguousReplayed, ambiguousDropped                        atomic.Uint64
	lastLossLog, lastAmbLog, lastBufLog, lastLedgerLog                           atomic.Int64
}

var _ store.Store = (*Store)(nil)

// New connects to Valkey and returns a store. It fails if the first
// connection cannot be made, unless ConnectInBackground is set (the error
// never contains the password).
func New(opts Options) (*Store, error) {
	co, err := clientOption(&opts)
	if err != nil {
		return nil, err
	}
	first := co
	if opts.ConnectInBackground {
		// A black-holed address must not hold the start for DialTimeout.
		first.Dialer.Timeout = min(first.Dialer.Timeout, time.Second)
	}
	c, err := valkey.NewClient(first)
	if err == nil {
		return NewWithClient(c, opts)
	}
	cerr := fmt.Errorf("connect to valkey %s (%s): %w: %s", strings.Join(opts.Addresses, ","), opts.Mode, store.ErrUnavailable, redact(err.Error(), opts))
	if !opts.ConnectInBackground || !unreachable(err) {
		// A refused password or certificate is a setting to fix, not an
		// outage to wait out.
		return nil, cerr
	}
	s, err := newStore(opts)
	if err != nil {
		return nil, err
	}
	s.log.Warn("valkey store: valkey unreachable at start; buffering charges and connecting in the background", "err", cerr)
	s.wg.Add(1)
	go s.connectLoop(co, opts)
	return s, nil
}

// unreachable reports whether a connection error means nothing answered
// (refused, timed out, no route): an outage, unlike a refused password or
// certificate.
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// connectLoop retries the first connection with backoff until it succeeds
// or the store is closed.
func (s *Store) connectLoop(co valkey.ClientOption, opts Options) {
	defer s.wg.Done()
	delay := 100 * time.Millisecond
	var lastLog atomic.Int64
	for {
		t := time.NewTimer(delay)
		select {
		case <-s.stop:
			t.Stop()
			return
		case <-t.C:
		}
		c, err := valkey.NewClient(co)
		if err == nil {
			select {
			case <-s.stop: // closed meanwhile: Close no longer looks
				c.Close()
				return
			default:
			}
			s.attach(c)
			s.log.Warn("valkey store: connected", "buffer_keys", s.Stats().BufferKeys)
			return
		}
		if every(&lastLog, 10*time.Second) {
			s.log.Warn("valkey store: still unreachable; retrying", "retry_in", (2 * delay).String(), "err", redact(err.Error(), opts))
		}
		delay = min(2*delay, 5*time.Second)
	}
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

func redact(s string, opts Options) string {
	for _, secret := range []string{opts.Password, opts.SentinelPassword} {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "<redacted>")
		}
	}
	return s
}

// clientOption validates opts, fills defaults in place and maps them to valkey-go.
func clientOption(opts *Options) (valkey.ClientOption, error) {
	if err := defaults(opts); err != nil {
		return valkey.ClientOption{}, err
	}
	if len(opts.Addresses) == 0 {
		return valkey.ClientOption{}, errors.New("valkey: no address")
	}
	for _, a := range opts.Addresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return valkey.ClientOption{}, fmt.Errorf("valkey: address %q: %w", a, err)
		}
	}
	co := valkey.ClientOption{
		InitAddress:       append([]string(nil), opts.Addresses...),
		Username:          opts.Username,
		Password:          opts.Password,
		TLSConfig:         opts.TLS,
		Dialer:            net.Dialer{Timeout: opts.DialTimeout, KeepAlive: opts.PingInterval},
		ConnWriteTimeout:  opts.ConnWriteTimeout,
		PipelineMultiplex: opts.PipelineMultiplex,
		MaxFlushDelay:     opts.MaxFlushDelay,
		RingScaleEachConn: opts.RingScale,
		// Counters change on every hit: client-side caching gains nothing,
		// and an ACL user without +client could not enable tracking.
		DisableCache: true,
		// Never retry: the caller has a deadline of a few ms, and a retried
		// read would outlive it. The next request asks again.
		DisableRetry: true,
		// A background reader on every connection notices a closed server
		// at once, so the next call redials (and a refused dial is known
		// not to have sent anything) instead of writing into a dead socket.
		AlwaysPipelining: true,
		DialCtxFn:        dial,
		ClientName:       "budgetgen",
	}
	switch opts.Mode {
	case Standalone:
		if opts.MasterSet != "" {
			return co, errors.New("valkey: MasterSet is only for sentinel mode")
		}
		if len(opts.Addresses) != 1 {
			return co, fmt.Errorf("valkey: standalone mode takes one address, got %d", len(opts.Addresses))
		}
		co.ForceSingleClient = true
	case Cluster:
		if opts.MasterSet != "" {
			return co, errors.New("valkey: MasterSet is only for sentinel mode")
		}
		co.ClusterOption.MaxMovedRedirections = 16
	case Sentinel:
		if opts.MasterSet == "" {
			return co, errors.New("valkey: sentinel mode needs MasterSet")
		}
		co.Sentinel = valkey.SentinelOption{
			MasterSet:               opts.MasterSet,
			Username:                opts.SentinelUsername,
			Password:                opts.SentinelPassword,
			TLSConfig:               opts.TLS,
			Dialer:                  co.Dialer,
			TopologyRefreshInterval: opts.SentinelRefresh,
		}
	default:
		return co, fmt.Errorf("valkey: unknown mode %q (want standalone, cluster or sentinel)", opts.Mode)
	}
	return co, nil
}

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
	if o.KnownExpiries == 0 {
		o.KnownExpiries = DefaultKnownExpiries
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
	if o.SentinelRefresh <= 0 {
		o.SentinelRefresh = DefaultSentinelRefresh
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
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
	s := &Store{
		slotted:   opts.Mode == Cluster,
		connected: make(chan struct{}),
		sem:       make(chan struct{}, opts.MaxInFlight),
		// A call's goroutine waits for valkey-go to give the ring slot back:
		// a stalled connection is torn down after about 2*PingInterval +
		// ConnWriteTimeout, a reconnect takes up to DialTimeout more.
		detach:      2*opts.PingInterval + 2*opts.ConnWriteTimeout + opts.DialTimeout + time.Second,
		connWrite:   opts.ConnWriteTimeout,
		log:         opts.Logger,
		now:         opts.Now,
		replayEvery: opts.ReplayInterval,
		stallAfter:  opts.StallAfter,
		epoch:       time.Now(),
		stop:        make(chan struct{}),
	}
	if opts.BufferMaxKeys > 0 {
		s.buf = newBuffer(opts.BufferMaxKeys)
	}
	if opts.KnownExpiries > 0 {
		s.known = newExpiryCache(opts.KnownExpiries)
	}
	if opts.Idempotent {
		id, err := newIdempotency(opts.IdempotencyWindow, opts.Mode == Cluster)
		if err != nil {
			return nil, err
		}
		s.idem = id
	}
	s.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	if s.buf != nil {
		s.wg.Add(1)
		go s.replayer()
	}
	return s, nil
}

// Stats returns cumulative counts.
func (s *Store) Stats() Stats {
	st := Stats{
		InFlight: int64(len(s.sem)),
		Canceled: s.canceled.Load(),
		NoSlot:   s.noSlot.Load(),

		NotConnected: s.notConnected.Load(),
		Stalled:      s.stallRefused.Load(),
		Buffered:     s.buffered.Load(),
		Replayed:     s.replayed.Load(),
		Lost:         s.lost.Load(),
		Expired:      s.expired.Load(),
		Ambiguous:    s.ambiguous.Load(),

		AmbiguousApplied:  s.ambiguousApplied.Load(),
		AmbiguousReplayed: s.ambiguousReplayed.Load(),
		AmbiguousDropped:  s.ambiguousDropped.Load(),

		AppliedOnError: s.appliedOnErr.Load(),

		LedgerBuffered:  s.ledgerBuffered.Load(),
		LedgerReplayed:  s.ledgerReplayed.Load(),
		LedgerLost:      s.ledgerLost.Load(),
		LedgerExpired:   s.ledgerExpired.Load(),
		LedgerAmbiguous: s.ledgerAmbiguous.Load(),
	}
	if s.buf != nil {
		st.BufferKeys = s.buf.size.Load()
	}
	return st
}

// call is one Charge in flight, owned by the caller until it gives up
// (abandoned), then by the goroutine that runs it.
type call struct {
	counters []store.Counter
	cmds     []valkey.Completed
	withExp  []bool   // per counter: PEXPIREAT NX sent with its INCRBY
	created  []int    // counters recreated without an expiry: they need it
	batches  []*batch // Idempotent: one script call per slot group (cmds[:len(batches)])
	pos      []uint64 // Idempotent: per counter, batch index<<32 | position in it
	totals   []uint64
	err      error
	applied  uint64       // hits Valkey confirmed
	state    atomic.Int32 // 0 running, 1 finished, 2 abandoned by the caller
	done     chan struct{}
}

const (
	running int32 = iota
	finished
	abandoned
)

// Charge implements store.Store.
func (s *Store) Charge(ctx context.Context, counters []store.Counter, totals []uint64) error {
	if err := ctx.Err(); err != nil {
		// The caller's deadline passed before it asked: nothing is sent or
		// buffered here; the hits are handed back (store.ErrNotSent, counted
		// in Canceled), and the engine's charger defers them.
		for _, k := range counters {
			s.canceled.Add(k.Hits)
		}
		return fmt.Errorf("%w: %w: %w", store.ErrUnavailable, store.ErrNotSent, err)
	}
	if err := validate(counters, totals); err != nil {
		return err
	}
	s.entry.RLock()
	c, err := s.start(ctx, counters, totals)
	s.entry.RUnlock()
	if c == nil {
		return err
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(running, abandoned) {
			return fmt.Errorf("%w: %w", store.ErrUnavailable, ctx.Err())
		}
		<-c.done // finished just now
	}
	err = c.err
	if err == nil {
		copy(totals, c.totals)
	}
	s.release(c)
	return err
}

// start is Charge from its closed check to its call goroutine's start, run
// under entry's read lock. It returns the running call, or nil and the
// error to return (the hits are then counted: buffered, or lost).
func (s *Store) start(ctx context.Context, counters []store.Counter, totals []uint64) (*call, error) {
	if s.closed.Load() {
		// A contract breach by the caller, but its hits are counted.
		for _, k := range counters {
			s.loss(k.Hits, "store closed")
		}
		return nil, errClosed
	}
	if len(counters) == 0 {
		return nil, nil
	}
	if !s.ready.Load() {
		s.notConnected.Add(1)
		s.notSent(counters)
		return nil, fmt.Errorf("%w: not connected to valkey yet: not sent", store.ErrUnavailable)
	}
	if since, stalled := s.stalled(); stalled {
		s.noSlot.Add(1)
		s.stallRefused.Add(1)
		s.notSent(counters)
		return nil, fmt.Errorf("%w: valkey has answered nothing for %v: not sent", store.ErrUnavailable, since.Round(time.Millisecond))
	}
	select {
	case s.sem <- struct{}{}:
	default:
		select {
		case s.sem <- struct{}{}:
		case <-ctx.Done():
			// Every slot is held by calls Valkey has not answered: this one
			// certainly was not sent.
			s.noSlot.Add(1)
			s.notSent(counters)
			return nil, fmt.Errorf("%w: no free slot (%d calls waiting for valkey): %w", store.ErrUnavailable, cap(s.sem), ctx.Err())
		}
	}
	c := s.calls.Get().(*call)
	c.state.Store(running)
	c.err = nil
	c.applied = 0
	c.counters = append(c.counters[:0], counters...)
	c.totals = append(c.totals[:0], totals...)
	s.build(c)
	s.workers.Add(1)
	go s.run(c)
	return c, nil
}

// Client returns the store's client (shared: never close it), so the
// shadow-week ledger (internal/ledger) batches its writes on the same
// connections; nil until the store is connected (ConnectInBackground).
func (s *Store) Client() Client {
	if !s.ready.Load() {
		return nil
	}
	return s.client
}

func (s *Store) release(c *call) {
	clear(c.counters) // drop key references
	c.counters = c.counters[:0]
	c.cmds = c.cmds[:0]
	c.withExp = c.withExp[:0]
	c.created = c.created[:0]
	clear(c.batches) // the buffer may hold them now
	c.batches = c.batches[:0]
	c.pos = c.pos[:0]
	s.calls.Put(c)
}

func (s *Store) build(c *call) {
	if s.idem != nil {
		s.buildIdempotent(c)
		return
	}
	for _, k := range c.counters {
		if k.Hits == 0 {
			c.cmds = append(c.cmds, s.cmd.get(k.Key))
			c.withExp = append(c.withExp, false)
			continue
		}
		c.cmds = append(c.cmds, s.cmd.incrby(k.Key, k.Hits))
		withExp := !s.known.has(k.Key, k.ExpireAt.UnixMilli())
		if withExp {
			c.cmds = append(c.cmds, s.cmd.pexpireatNX(k.Key, s.msString(k.ExpireAt)))
		}
		c.withExp = append(c.withExp, withExp)
		if k.Ledger.Key != "" {
			// The shadow-week ledger: at most one extra command, same round trip.
			c.cmds = append(c.cmds, s.cmd.hincrby(k.Ledger.Key, k.Ledger.Field, k.Hits))
		}
	}
}

// tsString caches the decimal form of the last expiry: most counters of a
// window share it, so the hot path formats no number.
type tsString struct {
	ms int64
	s  string
}

func (s *Store) msString(t time.Time) string {
	ms := t.UnixMilli()
	if p := s.ts.Load(); p != nil && p.ms == ms {
		return p.s
	}
	p := &tsString{ms: ms, s: strconv.FormatInt(ms, 10)}
	s.ts.Store(p)
	return p.s
}

// sharedCtx is a deadline context shared by the calls of about one second,
// so the hot path allocates no context and timer per call.
type sharedCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
	until  time.Time
}

// detached returns a context ending between detach-1s and detach from now.
func (s *Store) detached() context.Context {
	now := time.Now()
	if p := s.dctx.Load(); p != nil && p.until.Sub(now) > s.detach-time.Second {
		return p.ctx
	}
	until := now.Add(s.detach)
	ctx, cancel := context.WithDeadline(context.Background(), until)
	// Calls still using the previous context keep it; its timer releases
	// it at its deadline.
	s.dctx.Store(&sharedCtx{ctx: ctx, cancel: cancel, until: until})
	return ctx
}

// run executes c on its own goroutine, holding a slot until valkey-go returns.
func (s *Store) run(c *call) {
	defer s.workers.Done()
	ctx := s.detached()
	if s.unansweredSince.Load() == 0 {
		s.unansweredSince.CompareAndSwap(0, s.mono())
	}
	res := s.client.DoMulti(ctx, c.cmds...)
	if answered(res) {
		s.unansweredSince.Store(0)
	}
	if s.idem != nil {
		if len(res) == len(c.cmds) {
			s.retryNoScript(ctx, c.batches, res)
		}
		c.err = s.collectIdempotent(c, res)
	} else {
		c.err = s.collect(c, res)
	}
	if len(c.created) > 0 {
		c.err = cmp(c.err, s.setExpiries(ctx, c))
	}
	<-s.sem
	if c.state.CompareAndSwap(running, finished) {
		if c.err != nil {
			s.appliedOnErr.Add(c.applied)
		}
		c.done <- struct{}{}
		return
	}
	// The caller gave up: nobody else holds c.
	s.appliedOnErr.Add(c.applied)
	s.release(c)
}

// collect reads the replies into c.totals and deals with failures: buffers
// what certainly was not applied, counts what may have been.
func (s *Store) collect(c *call, res []valkey.ValkeyResult) error {
	if len(res) != len(c.cmds) {
		// Not a valkey-go reply shape: the commands were handed to the
		// client, so any of them may have been applied; none is known.
		for _, k := range c.counters {
			if k.Hits > 0 {
				s.maybeSent(k.Hits)
				if k.Ledger.Key != "" {
					s.ledgerMaybeSent(k.Hits)
				}
			}
		}
		return fmt.Errorf("%w: %d replies for %d commands", store.ErrMalformedReply, len(res), len(c.cmds))
	}
	var first error
	j := 0
	for i, k := range c.counters {
		if k.Hits == 0 {
			v, err := counterValue(res[j], true)
			j++
			if err != nil {
				first = cmp(first, fmt.Errorf("read counter %d: %w", i, err))
				continue
			}
			c.totals[i] = v
			continue
		}
		incr := res[j]
		j++
		var exp valkey.ValkeyResult
		if c.withExp[i] {
			exp = res[j]
			j++
		}
		var ledgerErr error
		if k.Ledger.Key != "" {
			ledgerErr = res[j].Error()
			j++
		}
		v, err := counterValue(incr, false)
		if err != nil {
			if !c.withExp[i] {
				// If this INCRBY recreated a counter Valkey had lost, nobody
				// saw it: have the next charge set the expiry again.
				s.known.forget(k.Key)
			}
			switch classify(incr.Error()) {
			case notApplied:
				// The counter only: its ledger write is dealt with below.
				s.bufferAdd(target{key: k.Key}, k.Hits, k.ExpireAt)
			case maybeApplied:
				s.maybeSent(k.Hits)
			case permanent:
				s.loss(k.Hits, "the key holds something that is not a counter")
			}
			first = cmp(first, fmt.Errorf("charge counter %d: %w", i, err))
		} else {
			c.totals[i] = v
			c.applied += k.Hits
			switch {
			case c.withExp[i]:
				if err := exp.Error(); err != nil {
					// The add is applied but its expiry may not be: have the
					// buffer set it (PEXPIREAT NX is idempotent), or the
					// counter would live forever.
					if s.buf != nil {
						s.bufferAdd(target{key: k.Key}, 0, k.ExpireAt)
					}
					first = cmp(first, fmt.Errorf("set expiry of counter %d: %w", i, wrapErr(err)))
				} else {
					s.known.add(k.Key, k.ExpireAt.UnixMilli(), s.now().UnixMilli())
				}
			case v == k.Hits:
				// Known to have its expiry, yet INCRBY returned exactly this
				// call's hits: Valkey lost the counter and this call created
				// it anew, without an expiry (every other INCRBY returns more
				// than its own hits, which are > 0).
				c.created = append(c.created, i)
			}
		}
		if ledgerErr != nil {
			// A measurement, not a counter: its failure never fails the
			// charge, but what certainly was not applied is buffered (after
			// the counter, as when a call is not sent at all).
			s.ledgerFailed(ledgerTarget(k.Ledger), k.Hits, k.ExpireAt, ledgerErr)
		}
	}
	return first
}

// answered reports whether Valkey answered any command of a call: a value
// or an error reply. Calls failed by the client (a torn-down connection, a
// timeout, a refused dial) do not count: one connection of a stalled server
// being torn down must not let new charges into the others.
func answered(res []valkey.ValkeyResult) bool {
	for _, r := range res {
		err := r.Error()
		if err == nil || valkey.IsValkeyNil(err) {
			return true
		}
		if _, ok := valkey.IsValkeyErr(err); ok {
			return true
		}
	}
	return false
}

// mono is the monotonic time since the store was made, in ns (never 0).
func (s *Store) mono() int64 { return int64(time.Since(s.epoch)) + 1 }

// stalled reports whether Valkey has answered nothing for StallAfter since
// a call was sent to it, and for how long. One call per StallAfter is let
// through a stall as a probe: its answer ends the stall.
func (s *Store) stalled() (time.Duration, bool) {
	u := s.unansweredSince.Load()
	if s.stallAfter <= 0 || u == 0 {
		return 0, false
	}
	now := s.mono()
	since := time.Duration(now - u)
	if since <= s.stallAfter {
		return since, false
	}
	if last := s.lastProbe.Load(); now-last >= int64(s.stallAfter) && s.lastProbe.CompareAndSwap(last, now) {
		return since, false // the probe
	}
	return since, true
}

// setExpiries gives the counters c recreated (Valkey lost them while this
// store knew their expiry) their absolute expiry, in a second round trip
// before the call returns. If it fails, the outage buffer sets it (PEXPIREAT
// NX is idempotent), and the call reports the error like any store error.
func (s *Store) setExpiries(ctx context.Context, c *call) error {
	cmds := make([]valkey.Completed, len(c.created))
	for n, i := range c.created {
		k := c.counters[i]
		cmds[n] = s.cmd.pexpireatNX(k.Key, s.msString(k.ExpireAt))
	}
	var first error
	for n, r := range s.client.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			k := c.counters[c.created[n]]
			s.known.forget(k.Key) // the next charge sends PEXPIREAT NX too
			if s.buf != nil {
				s.bufferAdd(target{key: k.Key}, 0, k.ExpireAt)
			}
			first = cmp(first, fmt.Errorf("set expiry of counter %d: %w", c.created[n], wrapErr(err)))
		}
	}
	return first
}

func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// counterValue parses an INCRBY or GET reply. A missing key (GET) is 0.
func counterValue(r valkey.ValkeyResult, get bool) (uint64, error) {
	v, err := r.AsInt64()
	if err != nil {
		if get && valkey.IsValkeyNil(err) {
			return 0, nil
		}
		return 0, wrapErr(err)
	}
	if v < 0 {
		return 0, fmt.Errorf("%w: negative counter %d", store.ErrMalformedReply, v)
	}
	return uint64(v), nil
}

type outcome int

const (
	maybeApplied outcome = iota // sent, no answer
	notApplied                  // certainly not applied
	permanent                   // answered with an error that retrying will not fix
)

// classify tells whether a failed write may have been applied.
func classify(err error) outcome {
	if err == nil {
		return maybeApplied
	}
	if ve, ok := valkey.IsValkeyErr(err); ok {
		if malformed(ve.Error()) {
			return permanent
		}
		return notApplied // an error reply: the command did nothing
	}
	var se *setupError
	if errors.As(err, &se) {
		return notApplied
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return notApplied
	}
	return maybeApplied
}

func malformed(msg string) bool {
	return strings.HasPrefix(msg, "WRONGTYPE") || strings.Contains(msg, "not an integer") || strings.Contains(msg, "overflow")
}

// wrapErr maps a valkey-go error to the store's sentinels: a reply that is
// not a counter is ErrMalformedReply, anything else ErrUnavailable.
func wrapErr(err error) error {
	if ve, ok := valkey.IsValkeyErr(err); ok {
		if strings.Contains(ve.Error(), "overflow") {
			return fmt.Errorf("%w: %s", store.ErrOverflow, ve.Error())
		}
		if malformed(ve.Error()) {
			return fmt.Errorf("%w: %s", store.ErrMalformedReply, ve.Error())
		}
		return fmt.Errorf("%w: %s", store.ErrUnavailable, ve.Error())
	}
	var ne *strconv.NumError
	if valkey.IsParseErr(err) || errors.As(err, &ne) {
		return fmt.Errorf("%w: %w", store.ErrMalformedReply, err)
	}
	return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
}

var errClosed = fmt.Errorf("%w: valkey store closed", store.ErrUnavailable)

func validate(counters []store.Counter, totals []uint64) error {
	if len(totals) != len(counters) {
		return fmt.Errorf("charge: %d totals for %d counters", len(totals), len(counters))
	}
	for i, c := range counters {
		if c.Hits > math.MaxInt64 {
			return fmt.Errorf("charge: counter %d: hits %d above %d", i, c.Hits, int64(math.MaxInt64))
		}
		if c.Hits > 0 && c.ExpireAt.IsZero() {
			return fmt.Errorf("charge: counter %d: zero ExpireAt would never expire", i)
		}
	}
	return nil
}

// notSent buffers the charged counters of a call that certainly did not
// reach Valkey, with their ledger increments.
func (s *Store) notSent(counters []store.Counter) {
	for _, k := range counters {
		if k.Hits > 0 {
			s.bufferAdd(target{key: k.Key}, k.Hits, k.ExpireAt)
			if k.Ledger.Key != "" {
				s.ledgerBufferAdd(ledgerTarget(k.Ledger), k.Hits, k.ExpireAt)
			}
		}
	}
}

func ledgerTarget(h store.HashIncr) target { return target{key: h.Key, field: h.Field, hash: true} }

func (s *Store) bufferAdd(t target, hits uint64, exp time.Time) {
	if s.buf == nil {
		s.loss(hits, "outage buffer disabled")
		return
	}
	if !s.buf.add(t, hits, exp) {
		s.loss(hits, "outage buffer full")
		return
	}
	if total := s.buffered.Add(hits); hits > 0 && every(&s.lastBufLog, time.Second) {
		s.log.Warn("valkey store: valkey unreachable, charges buffered for replay",
			"buffered_hits_total", total, "buffer_keys", s.buf.size.Load())
	}
}

// ledgerBufferAdd buffers a ledger increment that certainly did not reach
// Valkey. Its replay deadline is the counter's expiry: the engine only
// attaches ledger writes to day-window counters, whose expiry (the day's end
// plus a grace period) falls within the next day, while the ledger Recorder
// still re-sends the hash's EXPIREAT at every flush. So a replayed hash gets
// its expiry the way a normal one does, and no per-charge command is added.
func (s *Store) ledgerBufferAdd(t target, hits uint64, exp time.Time) {
	if s.buf == nil {
		s.ledgerLoss(hits, "outage buffer disabled")
		return
	}
	if !s.buf.add(t, hits, exp) {
		s.ledgerLoss(hits, "outage buffer full")
		return
	}
	s.ledgerBuffered.Add(hits)
}

// ledgerFailed deals with a failed HINCRBY of the ledger (on the charge path
// or in a replay): buffered when certainly not applied, else counted.
func (s *Store) ledgerFailed(t target, hits uint64, exp time.Time, err error) {
	switch classify(err) {
	case notApplied:
		s.ledgerBufferAdd(t, hits, exp)
	case maybeApplied:
		s.ledgerMaybeSent(hits)
	case permanent:
		s.ledgerLoss(hits, "the ledger key holds something that is not a hash of integers")
	}
}

func (s *Store) ledgerLoss(hits uint64, reason string) {
	if hits == 0 {
		return
	}
	total := s.ledgerLost.Add(hits)
	if every(&s.lastLedgerLog, time.Second) {
		s.log.Error("valkey store: ledger increments lost", "reason", reason,
			"lost_ledger_hits_total", total, "buffer_keys", s.Stats().BufferKeys)
	}
}

func (s *Store) ledgerMaybeSent(hits uint64) {
	total := s.ledgerAmbiguous.Add(hits)
	if every(&s.lastLedgerLog, time.Second) {
		s.log.Warn("valkey store: ledger increments sent but unanswered; maybe applied, not re-sent",
			"ambiguous_ledger_hits_total", total)
	}
}

func (s *Store) loss(hits uint64, reason string) {
	if hits == 0 {
		return
	}
	total := s.lost.Add(hits)
	if every(&s.lastLossLog, time.Second) {
		s.log.Error("valkey store: charges lost", "reason", reason,
			"lost_hits_total", total, "buffer_keys", s.Stats().BufferKeys)
	}
}

func (s *Store) maybeSent(hits uint64) {
	total := s.ambiguous.Add(hits)
	if every(&s.lastAmbLog, time.Second) {
		s.log.Warn("valkey store: charges sent but unanswered; maybe applied, not re-sent",
			"ambiguous_hits_total", total)
	}
}

// every reports whether at least d passed since the last time it said yes.
func every(last *atomic.Int64, d time.Duration) bool {
	now := time.Now().UnixNano()
	prev := last.Load()
	return now-prev >= int64(d) && last.CompareAndSwap(prev, now)
}

// Close stops the replayer, waits for calls in flight (bounded by the
// connection timeouts) and closes the client. Charges still buffered are
// counted as lost and logged. Idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.entry.Lock()
		s.closed.Store(true)
		s.entry.Unlock()
		close(s.stop)
		s.wg.Wait()
		s.workers.Wait()
		if s.buf != nil && s.ready.Load() {
			// One last bounded attempt to replay what is buffered.
			for end := time.Now().Add(2 * s.connWrite); s.buf.size.Load() > 0 && time.Now().Before(end); {
				if !s.replayOnce() {
					break
				}
			}
			if hits, ledgerHits, ambHits, entries := s.buf.drain(); hits > 0 || ledgerHits > 0 || ambHits > 0 {
				s.lost.Add(hits)
				s.ledgerLost.Add(ledgerHits)
				s.ambiguousDropped.Add(ambHits)
				s.log.Error("valkey store: closed with buffered charges not replayed", "lost_hits", hits, "lost_ledger_hits", ledgerHits, "ambiguous_dropped_hits", ambHits, "entries", entries)
			}
		}
		if s.buf != nil && !s.ready.Load() {
			if hits, ledgerHits, _, entries := s.buf.drain(); hits > 0 || ledgerHits > 0 {
				s.lost.Add(hits)
				s.ledgerLost.Add(ledgerHits)
				s.log.Error("valkey store: closed before ever connecting; buffered charges lost", "lost_hits", hits, "lost_ledger_hits", ledgerHits, "entries", entries)
			}
		}
		if s.ready.Load() {
			s.client.Close()
		}
	})
	return nil
}
