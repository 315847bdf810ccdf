package observe

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultStoreQuiet is StoreWatch.Quiet's default.
const DefaultStoreQuiet = time.Second

// StoreWatch logs the counter store's outages as an operator wants to read
// them: one WARN when requests start being answered by the failure policy,
// one INFO when the store answers again with no failure for Quiet, saying
// how long the outage lasted and how many requests the policy answered. A
// store that fails now and then inside Quiet stays one outage, so a flaky
// link does not flood the log. The success path costs one atomic load.
type StoreWatch struct {
	// Logger receives the two events; default slog.Default().
	Logger *slog.Logger
	// Store describes the store for the events ("valkey standalone ...").
	Store string
	// Quiet is how long the store must answer without a failure before the
	// outage is over; default DefaultStoreQuiet.
	Quiet time.Duration
	// Now is the clock of failures; default time.Now.
	Now func() time.Time

	failing  atomic.Bool
	lastFail atomic.Int64 // Unix nanoseconds
	failed   atomic.Uint64

	mu    sync.Mutex // orders the two events
	since time.Time
}

// Descriptor implements Observer: an item the store answered is a success.
func (w *StoreWatch) Descriptor(ctx context.Context, d *Descriptor) {
	if !w.failing.Load() || d.StoreFailed || d.Item.Cached {
		return
	}
	w.recovered(ctx, d.Now)
}

// Request implements Observer: a request the failure policy answered is a
// failure.
func (w *StoreWatch) Request(ctx context.Context, r *Request) {
	if r.FailurePolicy == "" {
		return
	}
	now := w.now()
	w.lastFail.Store(now.UnixNano())
	w.failed.Add(1)
	if w.failing.Load() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failing.Swap(true) {
		return
	}
	w.since = now
	w.logger().LogAttrs(ctx, slog.LevelWarn, "counter store failing: requests are answered by the failure policy",
		slog.String("store", w.Store), slog.String("failure_policy", r.FailurePolicy))
}

func (w *StoreWatch) recovered(ctx context.Context, now time.Time) {
	quiet := w.Quiet
	if quiet <= 0 {
		quiet = DefaultStoreQuiet
	}
	last := w.lastFail.Load()
	if now.UnixNano()-last < int64(quiet) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lastFail.Load() != last || !w.failing.Swap(false) {
		return // failed again meanwhile, or another request logged it
	}
	w.logger().LogAttrs(ctx, slog.LevelInfo, "counter store answering again",
		slog.String("store", w.Store),
		slog.String("outage", time.Unix(0, last).Sub(w.since).Round(time.Millisecond).String()),
		slog.Time("outage_start", w.since.UTC()), slog.Time("last_failure", time.Unix(0, last).UTC()),
		slog.Uint64("failure_policy_answers", w.failed.Swap(0)))
}

func (w *StoreWatch) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now()
}

func (w *StoreWatch) logger() *slog.Logger {
	if w.Logger != nil {
		return w.Logger
	}
	return slog.Default()
}
