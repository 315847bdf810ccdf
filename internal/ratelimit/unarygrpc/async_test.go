package unarygrpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding/gzip"
)

// asyncCall is a call an asynchronous handler started and left to answer.
type asyncCall struct {
	ctx   context.Context
	req   []byte // a copy: req is the server's only until the handler returns
	reply Reply
}

// serveAsync serves one asynchronous method whose calls go to the returned
// channel, to be answered by the test.
func serveAsync(t *testing.T, o Options, method string) (*testServer, chan asyncCall) {
	t.Helper()
	calls := make(chan asyncCall, 1024)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(o)
	s.HandleAsync(method, func(ctx context.Context, req []byte, reply Reply) {
		calls <- asyncCall{ctx, append([]byte(nil), req...), reply}
	})
	ts := &testServer{s: s, addr: l.Addr().String(), done: make(chan error, 1)}
	go func() { ts.done <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-ts.done; !errors.Is(err, ErrServerStopped) {
			t.Errorf("Serve returned %v, want ErrServerStopped", err)
		}
	})
	return ts, calls
}

// TestAsyncHandlerAnsweredElsewhere: calls of an asynchronous handler are
// answered by another goroutine, in any order, plain and gzip.
func TestAsyncHandlerAnsweredElsewhere(t *testing.T) {
	ts, calls := serveAsync(t, Options{Workers: 2}, "/t.S/Echo")
	go func() {
		for c := range calls {
			c.reply.Respond(append(c.reply.Buffer(), reversed(c.req)...), nil)
		}
	}()
	cc := dial(t, ts.addr)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				req := []byte(fmt.Sprintf("call %d/%d", g, i))
				var err error
				var out []byte
				if i%4 == 0 {
					out, err = call(ctx, cc, "/t.S/Echo", req, grpc.UseCompressor(gzip.Name))
				} else {
					out, err = call(ctx, cc, "/t.S/Echo", req)
				}
				if err != nil || !bytes.Equal(out, reversed(req)) {
					errs <- fmt.Errorf("call %d/%d: %q, %v", g, i, out, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitFor(t, "no stream left", func() bool { return serverStreams(ts.s) == 0 })
}

// TestAsyncAnswerAfterResetNotWritten: a call reset by its client while its
// asynchronous answer is pending gets no frame when the answer comes, and its
// slot is free once answered.
func TestAsyncAnswerAfterResetNotWritten(t *testing.T) {
	ts, calls := serveAsync(t, Options{MaxConcurrentStreams: 1}, "/t.S/Echo")
	r := dialRaw(t, ts.addr)
	r.headers(1, "/t.S/Echo", "application/grpc", false)
	r.message(1, []byte("abc"))
	c := <-calls
	_ = r.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	r.barrier([8]byte{1}, nil)
	if c.ctx.Err() == nil {
		t.Fatal("the reset did not cancel the call's context")
	}
	c.reply.Respond(append(c.reply.Buffer(), "late"...), nil)
	waitFor(t, "the answered call's slot freed", func() bool { return serverStreams(ts.s) == 0 })
	r.barrier([8]byte{2}, func(f http2.Frame) {
		if f.Header().StreamID == 1 {
			t.Errorf("frame %v written on stream 1 after its reset", f.Header().Type)
		}
	})
	r.headers(3, "/t.S/Echo", "application/grpc", false)
	r.message(3, []byte("x"))
	c = <-calls
	c.reply.Respond(append(c.reply.Buffer(), "y"...), nil)
	r.until("trailers on 3", func(f http2.Frame) bool {
		if rs, ok := f.(*http2.RSTStreamFrame); ok && rs.StreamID == 3 {
			t.Fatalf("stream 3 refused (%v)", rs.ErrCode)
		}
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == 3 && h.StreamEnded()
	})
}
