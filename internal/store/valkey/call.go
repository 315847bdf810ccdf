package valkey

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/budgetgen/budgetgen/internal/store"
)

// call is one Charge in flight, owned by the caller until it gives up
// (abandoned), then by the goroutine that runs it.
type call struct {
	counters []store.Counter
	results  []store.Result
	groups   []*group // script calls (cmds[:len(groups)])
	spare    []*group // groups of earlier calls, reused
	gets     []int    // counters read by a plain GET, after the scripts
	pos      []int32  // per counter: group<<16 | op, or -1
	replies  []opResult
	cmds     []valkey.Completed
	now      time.Time
	err      error
	applied  [3]uint64    // counter hits, releases and ledger hits Valkey confirmed
	state    atomic.Int32 // running, finished, abandoned
	done     chan struct{}
}

const (
	running int32 = iota
	finished
	abandoned
)

// groupFor returns the call's group of slot sl, adding one.
func (c *call) groupFor(sl uint16) (int, *group) {
	for i, g := range c.groups {
		if g.slot == sl {
			return i, g
		}
	}
	var g *group
	if n := len(c.spare); n > 0 {
		g, c.spare = c.spare[n-1], c.spare[:n-1]
	} else {
		g = new(group)
	}
	*g = group{slot: sl, ops: g.ops[:0]}
	c.groups = append(c.groups, g)
	return len(c.groups) - 1, g
}

// Charge implements store.Store.
func (s *Store) Charge(ctx context.Context, counters []store.Counter, results []store.Result) error {
	if err := ctx.Err(); err != nil {
		// The caller's deadline passed before it asked: nothing is sent or
		// buffered here; the hits are handed back (store.ErrNotSent), and the
		// engine's charger defers them.
		for i := range counters {
			s.countWrite(&counters[i], store.NotSent)
		}
		return fmt.Errorf("%w: %w: %w", store.ErrUnavailable, store.ErrNotSent, err)
	}
	if err := validate(counters, results); err != nil {
		return err
	}
	s.entry.RLock()
	c, err := s.start(ctx, counters, results)
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
		copy(results, c.results)
	}
	s.release(c)
	return err
}

// start is Charge from its closed check to its call goroutine's start, run
// under entry's read lock. It returns the running call, or nil and the
// error to return (the writes are then accounted for: buffered, or lost).
func (s *Store) start(ctx context.Context, counters []store.Counter, results []store.Result) (*call, error) {
	if s.closed.Load() {
		// A contract breach by the caller, but its hits are counted.
		for i := range counters {
			s.countWrite(&counters[i], store.Lost)
		}
		s.logs.loss(s.log, "store closed", s.Stats())
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
	if since, stalled := s.stall.stalled(); stalled {
		s.noSlot.Add(1)
		s.stalledCalls.Add(1)
		s.notSent(counters)
		return nil, fmt.Errorf("%w: valkey has answered nothing for %v: not sent", store.ErrUnavailable, since.Round(time.Millisecond))
	}
	if !s.acquire(ctx) {
		// Every slot is held by calls Valkey has not answered: this one
		// certainly was not sent.
		s.noSlot.Add(1)
		s.notSent(counters)
		return nil, fmt.Errorf("%w: no free slot (%d calls waiting for valkey): %w", store.ErrUnavailable, cap(s.sem), ctx.Err())
	}
	c := s.calls.Get().(*call)
	c.state.Store(running)
	c.err, c.applied, c.now = nil, [3]uint64{}, s.now()
	c.counters = append(c.counters[:0], counters...)
	c.results = append(c.results[:0], results...)
	c.pos = resize(c.pos, len(counters))
	s.plan(c, c.now)
	s.build(c)
	s.workers.Add(1)
	go s.run(c)
	return c, nil
}

// resize returns s with length n, zeroed, reusing its array when it can.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// acquire takes an in-flight slot, waiting no longer than ctx.
func (s *Store) acquire(ctx context.Context) bool {
	select {
	case s.sem <- struct{}{}:
		return true
	default:
	}
	select {
	case s.sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// build lays out the call's commands: scripts, then GETs.
func (s *Store) build(c *call) {
	for _, g := range c.groups {
		c.cmds = append(c.cmds, s.scriptCmd(g, false, c.now))
	}
	for _, i := range c.gets {
		c.cmds = append(c.cmds, s.cmd.get(c.counters[i].Key))
	}
}

func (s *Store) release(c *call) {
	clear(c.counters) // drop key references
	c.counters = c.counters[:0]
	for _, g := range c.groups {
		clear(g.ops)
		g.id = idRef{}
	}
	c.spare = append(c.spare, c.groups...)
	clear(c.groups)
	c.groups = c.groups[:0]
	c.gets, c.pos = c.gets[:0], c.pos[:0]
	clear(c.cmds)
	c.cmds = c.cmds[:0]
	s.calls.Put(c)
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

// run executes c on its own goroutine, holding a slot until valkey-go
// returns, then settles what became of its writes.
func (s *Store) run(c *call) {
	defer s.workers.Done()
	ctx := s.detached()
	res := s.do(ctx, c.cmds)
	if len(res) == len(c.cmds) {
		s.retryNoScript(ctx, c.groups, res, c.now)
		s.retryTryAgain(ctx, c.groups, res, c.now)
	}
	c.err = s.collect(c, res)
	if c.err == nil {
		c.err = s.withdraw(ctx, c)
	}
	if gaveUp(res) {
		// valkey-go returned before writing or answering (its context
		// ended): the commands may still sit in its queue and be written
		// later, so their slice is left to it, not cleared and reused.
		c.cmds = nil
	}
	<-s.sem
	class := store.AppliedOnError
	if c.state.CompareAndSwap(running, finished) {
		if c.err == nil {
			class = store.Applied
		}
		s.countApplied(c, class)
		c.done <- struct{}{}
		return
	}
	// The caller gave up: nobody else holds c.
	s.countApplied(c, class)
	s.release(c)
}

// gaveUp reports whether valkey-go answered any command of a call with its
// context's error: it may still hold the commands (pipe.go, DoMulti's abort
// path keeps them queued until their reply).
func gaveUp(res []valkey.ValkeyResult) bool {
	for i := range res {
		if err := res[i].NonValkeyError(); err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
			return true
		}
	}
	return false
}

// countApplied counts what Valkey confirmed applying in class c (the
// measurement is a measurement: applied, whatever the call's error).
func (s *Store) countApplied(x *call, c store.Class) {
	s.tally.Add(store.TargetCounter, c, x.applied[0])
	s.tally.Add(store.TargetRelease, c, x.applied[1])
	s.tally.Add(store.TargetLedger, store.Applied, x.applied[2])
}

// do sends cmds, keeping the stall guard informed.
func (s *Store) do(ctx context.Context, cmds []valkey.Completed) []valkey.ValkeyResult {
	s.stall.sent()
	res := s.client.DoMulti(ctx, cmds...)
	if answered(res) {
		s.stall.answered()
	}
	return res
}

// retryNoScript re-sends as EVAL the script calls answered NOSCRIPT (Valkey
// restarted, failed over or flushed its script cache): an error reply, so
// nothing was applied. EVAL loads the script for the next EVALSHA.
func (s *Store) retryNoScript(ctx context.Context, gs []*group, res []valkey.ValkeyResult, now time.Time) {
	if idx := failedWith(res[:len(gs)], noScript); len(idx) > 0 {
		s.resend(ctx, gs, res, idx, true, now, errRetryUnanswered)
	}
}

var errRetryUnanswered = errors.New("EVAL after NOSCRIPT: reply missing")

// tryAgainAttempts and tryAgainPause bound retryTryAgain: a slot migration
// moves a batch of keys in milliseconds.
const (
	tryAgainAttempts = 5
	tryAgainPause    = 2 * time.Millisecond
)

// retryTryAgain re-sends the script calls answered TRYAGAIN, a few times
// after a short pause. A cluster answers TRYAGAIN to a multi-key command
// while a slot migrates and its keys are split between the two nodes
// (https://valkey.io/topics/cluster-spec/, "Multi-keys operations"): an
// error reply before the script ran, so nothing was applied and the same
// call under the same id may be sent again. valkey-go does not retry it
// here (DisableRetry). Without this a migration failed the charges of the
// migrating slot (buffered and replayed: counted, but answered by the
// failure policy).
func (s *Store) retryTryAgain(ctx context.Context, gs []*group, res []valkey.ValkeyResult, now time.Time) {
	for attempt := 1; attempt <= tryAgainAttempts; attempt++ {
		idx := failedWith(res[:len(gs)], tryAgain)
		if len(idx) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(attempt) * tryAgainPause):
		}
		if !s.resend(ctx, gs, res, idx, false, now, errTryAgainUnanswered) {
			return
		}
		// The node that answers now (the migration's target) may not have
		// the script yet.
		s.retryNoScript(ctx, gs, res, now)
	}
}

var errTryAgainUnanswered = errors.New("script call after TRYAGAIN: reply missing")

// failedWith lists the indexes of res that match.
func failedWith(res []valkey.ValkeyResult, match func(valkey.ValkeyResult) bool) []int {
	var idx []int
	for i := range res {
		if match(res[i]) {
			idx = append(idx, i)
		}
	}
	return idx
}

// resend sends groups idx of gs again (EVAL when eval) and puts their replies
// in res. When the client hands back fewer replies than it took, the calls
// may have been applied: each gets missing, an error that is never summed
// back into the buffer, and resend reports false.
func (s *Store) resend(ctx context.Context, gs []*group, res []valkey.ValkeyResult, idx []int, eval bool, now time.Time, missing error) bool {
	cmds := make([]valkey.Completed, len(idx))
	for n, i := range idx {
		cmds[n] = s.scriptCmd(gs[i], eval, now)
	}
	again := s.do(ctx, cmds)
	if len(again) != len(idx) {
		for _, i := range idx {
			res[i] = valkey.NewErrorResult(missing)
		}
		return false
	}
	for n, i := range idx {
		res[i] = again[n]
	}
	return true
}

func tryAgain(r valkey.ValkeyResult) bool {
	ve, ok := valkey.IsValkeyErr(r.Error())
	return ok && ve.IsTryAgain()
}

func validate(counters []store.Counter, results []store.Result) error {
	if len(results) != len(counters) {
		return fmt.Errorf("charge: %d results for %d counters", len(results), len(counters))
	}
	for i, c := range counters {
		if c.Hits > math.MaxInt64 {
			return fmt.Errorf("charge: counter %d: hits %d above %d", i, c.Hits, int64(math.MaxInt64))
		}
		if (c.Hits > 0 || c.Hold.On()) && c.ExpireAt.IsZero() {
			return fmt.Errorf("charge: counter %d: zero ExpireAt would never expire", i)
		}
		if c.Hold.On() && c.Hold.Expiry <= 0 {
			return fmt.Errorf("charge: counter %d: holds need their expiry", i)
		}
	}
	return nil
}
