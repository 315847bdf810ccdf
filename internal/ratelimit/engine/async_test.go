package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// countReply counts replies and keeps the first.
type countReply struct {
	n     atomic.Int32
	first chan *rlpb.RateLimitResponse
}

func (c *countReply) Reply(resp *rlpb.RateLimitResponse, err error) {
	if c.n.Add(1) == 1 {
		if err != nil {
			resp = nil
		}
		c.first <- resp
	}
}

// TestDecideDoesNotWaitForTheStore: Decide returns while its store call is
// blocked, and the decision is replied once, by the failure policy at the
// store deadline (fail open: OK), from another goroutine.
func TestDecideDoesNotWaitForTheStore(t *testing.T) {
	f := newFixture(t, "memory", Options{OverLimitCacheSize: -1, StoreTimeout: 20 * time.Millisecond}, testConfig)
	f.st.block = true
	r := &countReply{first: make(chan *rlpb.RateLimitResponse, 1)}
	returned := make(chan struct{})
	go func() {
		f.e.Decide(context.Background(), req("d", 1, d("user", "a")), r)
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("Decide waited for the blocked store")
	}
	select {
	case resp := <-r.first:
		if resp == nil || resp.OverallCode != OK {
			t.Fatalf("reply %v, want OK by the failure policy", resp)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reply at the store deadline")
	}
	_ = f.e.Close() // the batch is done: a late completion would have replied again
	if n := r.n.Load(); n != 1 {
		t.Fatalf("replied %d times, want once", n)
	}
}
