package unarygrpc

import (
	"context"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

func blockedStream(t *testing.T) (*testServer, *raw, chan error, chan struct{}) {
	ts := serve(t, Options{}, nil)
	ended := make(chan error, 1)
	sending := make(chan struct{}, 1)
	ts.s.HandleServerStream("/t.S/W", func(ctx context.Context, req []byte, send func([]byte) error) error {
		sending <- struct{}{}
		err := send([]byte("hello"))
		ended <- err
		return err
	})
	r := dialRaw(t, ts.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	r.headers(1, "/t.S/W", "application/grpc", false)
	r.message(1, []byte("x"))
	<-sending
	// send writes the answer's HEADERS, then waits for window: the flusher
	// can write them only once send has released the write lock, so after
	// they arrive (and a PING round trip with no DATA) send is waiting, or
	// has wrongly returned already.
	r.until("answer HEADERS on 1", func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == 1
	})
	r.barrier([8]byte{1}, func(f http2.Frame) {
		if _, ok := f.(*http2.DataFrame); ok {
			t.Fatalf("DATA sent on a window of 0")
		}
	})
	select {
	case err := <-ended:
		t.Fatalf("send did not wait for window: %v", err)
	default:
	}
	return ts, r, ended, sending
}

func sendEnded(t *testing.T, ended chan error, what string) {
	select {
	case err := <-ended:
		if err == nil {
			t.Fatalf("%s: send succeeded", what)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("%s: send blocked on window still waiting", what)
	}
}

func TestBlockedSendRST(t *testing.T) {
	_, r, ended, _ := blockedStream(t)
	if err := r.fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	sendEnded(t, ended, "rst")
}

func TestBlockedSendPeerClose(t *testing.T) {
	_, r, ended, _ := blockedStream(t)
	r.c.Close()
	sendEnded(t, ended, "peer close")
}

func TestBlockedSendStop(t *testing.T) {
	ts, _, ended, _ := blockedStream(t)
	go ts.s.Stop()
	sendEnded(t, ended, "stop")
}

// GracefulStop with a streaming call waiting for window: once the window
// comes, the message and the trailers are written, then the connection closes.
func TestBlockedSendGracefulStop(t *testing.T) {
	ts, r, ended, _ := blockedStream(t)
	stopped := make(chan struct{})
	go func() { ts.s.GracefulStop(); close(stopped) }()
	r.until("GOAWAY", func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok })
	if err := r.fr.WriteWindowUpdate(1, 100); err != nil {
		t.Fatal(err)
	}
	var data, trailers bool
	r.until("trailers", func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.DataFrame:
			data = true
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				trailers = true
				return true
			}
		}
		return false
	})
	if !data || !trailers {
		t.Fatal("no data")
	}
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	case <-time.After(3 * time.Second):
		t.Fatal("GracefulStop did not return after the stream ended")
	}
}
