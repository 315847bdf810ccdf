package charge

import (
	"context"
	"sync"
	"time"
)

// deadlines hands out store-call contexts shared by every call whose
// deadline falls in the same millisecond, so the hot path creates no timer
// and no context per call (context.WithTimeout costs a timer, an allocation
// and a child registration on gRPC's stream context). A deadline may end up
// to one millisecond later than asked. Parent cancellation is not propagated:
// a call whose client went away still ends at its own deadline, which is at
// most StoreTimeout away.
type deadlines struct {
	mu  sync.Mutex
	cur *msCtx
}

type msCtx struct {
	deadline time.Time
	done     chan struct{}
	once     sync.Once

	// mu guards the calls to answer at the deadline (watch) and fired.
	mu      sync.Mutex
	fired   bool
	waiters []waiter
}

// waiter is a queued call to answer at its context's deadline unless its
// batch answered it first: gen is the call's generation in p.state, so a
// pending reused by a later call is left alone.
type waiter struct {
	p   *pending
	gen uint64
}

func (c *msCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *msCtx) Done() <-chan struct{}       { return c.done }
func (c *msCtx) Value(any) any               { return nil }
func (c *msCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
	}
	if !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

func (c *msCtx) expire() {
	c.once.Do(func() {
		c.mu.Lock()
		c.fired = true
		ws := c.waiters
		c.waiters = nil
		c.mu.Unlock()
		// The calls first: a store call sharing this context returns when
		// it is done, and its calls are answered at their deadline, not
		// by that call's error.
		for _, w := range ws {
			w.p.expire(w.gen)
		}
		close(c.done)
	})
}

// watch answers p (generation gen) at this context's deadline if nothing
// answered it before; at once if the deadline already passed.
func (c *msCtx) watch(p *pending, gen uint64) {
	c.mu.Lock()
	if !c.fired {
		c.waiters = append(c.waiters, waiter{p, gen})
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	p.expire(gen)
}

// after returns a context that expires timeout from now, rounded up to the
// next millisecond.
func (d *deadlines) after(now time.Time, timeout time.Duration) context.Context {
	return d.ms(now, timeout)
}

func (d *deadlines) ms(now time.Time, timeout time.Duration) *msCtx {
	dl := now.Add(timeout).Truncate(time.Millisecond).Add(time.Millisecond)
	d.mu.Lock()
	if c := d.cur; c != nil && c.deadline.Equal(dl) {
		d.mu.Unlock()
		return c
	}
	c := &msCtx{deadline: dl, done: make(chan struct{})}
	d.cur = c
	d.mu.Unlock()
	time.AfterFunc(dl.Sub(now), c.expire)
	return c
}
