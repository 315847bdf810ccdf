package unarygrpc

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestDecompressedRequestsCountAsHeld: what gzip requests inflate to counts
// in the connection's held bytes (MaxHeldBytes), as their DATA does. A
// 1 MiB request compresses to about 1 KB, so without this a connection
// within its held bound on the wire (1,024 streams of 1 KB) made its
// handlers hold 1,024 times the message limit: 4 GiB at the defaults.
func TestDecompressedRequestsCountAsHeld(t *testing.T) {
	const maxHeld, plain, streams = 4 << 20, 1<<20 - 4096, 12
	var inHandlers, peak atomic.Int64
	entered := make(chan struct{}, streams)
	release := make(chan struct{})
	hold := func(ctx context.Context, req, dst []byte) ([]byte, error) {
		n := inHandlers.Add(int64(len(req)))
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		inHandlers.Add(-int64(len(req)))
		return append(dst, 'k'), nil
	}
	ts := serve(t, Options{MaxHeldBytes: maxHeld}, map[string]Handler{"/t.S/Hold": hold})
	r := dialRaw(t, ts.addr)
	bomb := gz(t, make([]byte, plain))
	var mu sync.Mutex
	status := map[uint32]string{}
	answered := make(chan struct{}, streams+1)
	go func() {
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				return
			}
			if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamEnded() {
				mu.Lock()
				status[h.StreamID] = headerValue(h, "grpc-status")
				mu.Unlock()
				answered <- struct{}{}
			}
		}
	}()
	send := func(id uint32) {
		r.buf.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/t.S/Hold"}, {":authority", "x"},
			{"content-type", "application/grpc"}, {"te", "trailers"}, {"grpc-encoding", "gzip"}} {
			_ = r.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.buf.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		msg := append([]byte{1, 0, 0, 0, 0}, bomb...)
		msg[1], msg[2], msg[3], msg[4] = byte(len(bomb)>>24), byte(len(bomb)>>16), byte(len(bomb)>>8), byte(len(bomb))
		if err := r.fr.WriteData(id, true, msg); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint32(0); i < streams; i++ {
		send(2*i + 1)
	}
	timeout := time.After(10 * time.Second)
	var in, refused int
	for in+refused < streams {
		select {
		case <-entered:
			in++
		case <-answered:
			refused++
		case <-timeout:
			t.Fatalf("%d calls in handlers, %d answered: want %d in all", in, refused, streams)
		}
	}
	mu.Lock()
	for id, s := range status {
		if s != "8" {
			t.Errorf("stream %d answered grpc-status %q before release, want 8 (ResourceExhausted)", id, s)
		}
	}
	mu.Unlock()
	t.Logf("%d calls in handlers, %d refused; peak %d decompressed bytes in handlers", in, refused, peak.Load())
	if p := peak.Load(); p > maxHeld {
		t.Errorf("handlers held %d decompressed bytes at once, above the connection's %d", p, maxHeld)
	}
	if in == 0 {
		t.Error("no call reached its handler")
	}
	close(release)
	// The held bytes are given back: a call after the others is served.
	send(2*streams + 1)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("a call after the release never reached its handler")
	}
}
