package unarygrpc

import (
	"context"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// A client resets a stream whose answer is waiting for flow-control window:
// the stream must free its MAX_CONCURRENT_STREAMS slot (it once stayed in
// c.streams forever, and GracefulStop never finished).
func TestResetOfBlockedAnswerFreesItsStream(t *testing.T) {
	ts := serve(t, Options{MaxConcurrentStreams: 1}, map[string]Handler{"/t.S/Echo": echo})
	r := dialRaw(t, ts.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	r.headers(1, "/t.S/Echo", "application/grpc", false)
	r.message(1, []byte("abc"))
	r.until("answer HEADERS on 1 (DATA blocked on window 0)", func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == 1 && !h.StreamEnded()
	})
	_ = r.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	// Once the PING after the reset is acked, the server has handled the
	// reset: stream 3 then finds the slot free, or never will.
	r.barrier([8]byte{1}, nil)
	r.headers(3, "/t.S/Echo", "application/grpc", false)
	r.message(3, []byte("x"))
	r.until("an answer or a refusal on 3", func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			if f.StreamID == 3 {
				t.Fatalf("stream 3 refused (%v): reset stream 1 still holds the only slot", f.ErrCode)
			}
		case *http2.MetaHeadersFrame:
			return f.StreamID == 3
		}
		return false
	})
	// Window for stream 3: its answer completes, and no call is left.
	_ = r.fr.WriteWindowUpdate(3, 1<<16)
	r.until("trailers on 3", func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == 3 && h.StreamEnded()
	})

	done := make(chan struct{})
	go func() { ts.s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(waitBound):
		t.Errorf("GracefulStop still waiting %v after the only call was reset", waitBound)
	}
}

// DATA after END_STREAM makes the server send RST_STREAM(STREAM_CLOSED); the
// running handler's answer must not follow on that closed stream.
func TestNoFramesAfterOwnRST(t *testing.T) {
	release := make(chan struct{})
	ts := serve(t, Options{}, map[string]Handler{"/t.S/Block": func(_ context.Context, _, dst []byte) ([]byte, error) {
		<-release
		return append(dst, 1), nil
	}})
	r := dialRaw(t, ts.addr)
	r.headers(1, "/t.S/Block", "application/grpc", false)
	r.message(1, nil) // END_STREAM
	_ = r.fr.WriteData(1, false, []byte{0})
	r.until("RST_STREAM on 1", func(f http2.Frame) bool {
		rs, ok := f.(*http2.RSTStreamFrame)
		return ok && rs.StreamID == 1
	})
	close(release)
	_ = r.fr.WritePing(false, [8]byte{9})
	r.until("PING ack", func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 {
				t.Errorf("server sent HEADERS on stream 1 after its own RST_STREAM (RFC 9113 5.1: no frames on a closed stream)")
			}
		case *http2.DataFrame:
			if f.StreamID == 1 {
				t.Errorf("server sent DATA on stream 1 after its own RST_STREAM")
			}
		case *http2.PingFrame:
			return f.IsAck() && f.Data == [8]byte{9}
		}
		return false
	})
	// The handler's answer (if any) is queued before its stream is removed:
	// once the server holds no stream, a PING's ack comes after anything
	// that answer wrote.
	waitFor(t, "the released handler's stream to be removed", func() bool { return serverStreams(ts.s) == 0 })
	_ = r.fr.WritePing(false, [8]byte{10})
	r.until("PING ack 2", func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 {
				t.Errorf("server sent HEADERS on stream 1 after its own RST_STREAM (RFC 9113 5.1: no frames on a closed stream)")
			}
		case *http2.PingFrame:
			return f.IsAck() && f.Data == [8]byte{10}
		}
		return false
	})
}
