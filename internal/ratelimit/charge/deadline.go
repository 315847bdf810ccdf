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

func (c *msCtx) expire() { c.once.Do(func() { close(c.done) }) }

// after returns a context that expires timeout from now, rounded up to the
// next millisecond.
func (d *deadlines) after(now time.Time, timeout time.Duration) context.Context {
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
