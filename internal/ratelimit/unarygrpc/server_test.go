package unarygrpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/status"
)

// rawCodec lets a grpc-go client send and receive raw message bytes.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// echo answers with its request, reversed, so a test sees the handler ran on
// exactly the bytes sent.
func echo(_ context.Context, req, dst []byte) ([]byte, error) {
	for i := len(req) - 1; i >= 0; i-- {
		dst = append(dst, req[i])
	}
	return dst, nil
}

type testServer struct {
	s    *Server
	addr string
	done chan error
}

func serve(t *testing.T, o Options, methods map[string]Handler) *testServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(o)
	for m, h := range methods {
		s.Handle(m, h)
	}
	ts := &testServer{s: s, addr: l.Addr().String(), done: make(chan error, 1)}
	go func() { ts.done <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-ts.done; !errors.Is(err, ErrServerStopped) {
			t.Errorf("Serve returned %v, want ErrServerStopped", err)
		}
	})
	return ts
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func call(ctx context.Context, cc *grpc.ClientConn, method string, req []byte, opts ...grpc.CallOption) ([]byte, error) {
	var out []byte
	err := cc.Invoke(ctx, method, &req, &out, append([]grpc.CallOption{grpc.ForceCodec(rawCodec{})}, opts...)...)
	return out, err
}

func reversed(b []byte) []byte {
	r := make([]byte, len(b))
	for i := range b {
		r[len(b)-1-i] = b[i]
	}
	return r
}

func TestUnaryCallsFromGRPCGo(t *testing.T) {
	for _, workers := range []int{0, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			ts := serve(t, Options{Workers: workers}, map[string]Handler{"/t.S/Echo": echo})
			cc := dial(t, ts.addr)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for g := 0; g < 32; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					for i := 0; i < 50; i++ {
						req := []byte(fmt.Sprintf("call %d/%d %s", g, i, strings.Repeat("x", i*37)))
						out, err := call(ctx, cc, "/t.S/Echo", req)
						if err != nil || !bytes.Equal(out, reversed(req)) {
							errs <- fmt.Errorf("call %d/%d: %q, %v", g, i, out, err)
							return
						}
					}
				}(g)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			// An empty message is a message too.
			if out, err := call(ctx, cc, "/t.S/Echo", nil); err != nil || len(out) != 0 {
				t.Fatalf("empty request: %q, %v", out, err)
			}
		})
	}
}

func TestStatusesAsGRPCGoSeesThem(t *testing.T) {
	ts := serve(t, Options{}, map[string]Handler{
		"/t.S/Fail": func(context.Context, []byte, []byte) ([]byte, error) {
			return nil, status.Error(codes.InvalidArgument, "bad descriptor: 100% \"wrong\"\nnext line, é")
		},
		"/t.S/Plain": func(context.Context, []byte, []byte) ([]byte, error) {
			return nil, errors.New("plain error")
		},
		"/t.S/Echo": echo,
	})
	cc := dial(t, ts.addr)
	ctx := context.Background()
	cases := []struct {
		method string
		code   codes.Code
		msg    string
	}{
		{"/t.S/Fail", codes.InvalidArgument, "bad descriptor: 100% \"wrong\"\nnext line, é"},
		{"/t.S/Plain", codes.Unknown, "plain error"},
		{"/t.S/Nope", codes.Unimplemented, "unknown method Nope for service t.S"},
		{"/other.Svc/Echo", codes.Unimplemented, "unknown service other.Svc"},
	}
	for _, tc := range cases {
		_, err := call(ctx, cc, tc.method, []byte("x"))
		st, _ := status.FromError(err)
		if st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("%s: got %v %q, want %v %q", tc.method, st.Code(), st.Message(), tc.code, tc.msg)
		}
	}
	// The connection is still good after errors.
	if out, err := call(ctx, cc, "/t.S/Echo", []byte("ok")); err != nil || string(out) != "ko" {
		t.Fatalf("after errors: %q, %v", out, err)
	}
}

func TestLargeAnswerWaitsForFlowControl(t *testing.T) {
	// 300 KiB answers through a client window of 64 KiB: the answer must be
	// sent in pieces as the client returns window.
	big := bytes.Repeat([]byte("0123456789abcdef"), 300<<10/16)
	ts := serve(t, Options{}, map[string]Handler{"/t.S/Big": func(_ context.Context, req, dst []byte) ([]byte, error) {
		return append(dst, big...), nil
	}})
	cc := dial(t, ts.addr, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<20)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := call(ctx, cc, "/t.S/Big", []byte("x"))
			if err != nil || !bytes.Equal(out, big) {
				t.Errorf("big answer: %d bytes, %v", len(out), err)
			}
		}()
	}
	wg.Wait()
}

func TestOversizedAndCompressedRequests(t *testing.T) {
	var ran atomic.Int32
	ts := serve(t, Options{MaxRecvMsgSize: 1000}, map[string]Handler{"/t.S/Echo": func(ctx context.Context, req, dst []byte) ([]byte, error) {
		ran.Add(1)
		return echo(ctx, req, dst)
	}})
	cc := dial(t, ts.addr)
	ctx := context.Background()
	_, err := call(ctx, cc, "/t.S/Echo", make([]byte, 1001))
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "larger than max (1001 vs. 1000)") {
		t.Errorf("oversized: %v", err)
	}
	// Compressed: 1001 zeros compress to a few bytes but inflate over the
	// bound (a decompression bomb): refused after decompression.
	_, err = call(ctx, cc, "/t.S/Echo", make([]byte, 1001), grpc.UseCompressor(gzip.Name))
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "after decompression larger than max (1000)") {
		t.Errorf("compressed, oversized: %v", err)
	}
	req := bytes.Repeat([]byte("ab"), 250)
	if out, err := call(ctx, cc, "/t.S/Echo", req, grpc.UseCompressor(gzip.Name)); err != nil || !bytes.Equal(out, reversed(req)) {
		t.Errorf("compressed: %q, %v", out, err)
	}
	if out, err := call(ctx, cc, "/t.S/Echo", make([]byte, 1000)); err != nil || len(out) != 1000 {
		t.Errorf("at the limit: %d bytes, %v", len(out), err)
	}
	if n := ran.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2 (only for the requests within limits)", n)
	}
}

func TestClientCancelCancelsHandler(t *testing.T) {
	started, canceled := make(chan struct{}), make(chan struct{})
	ts := serve(t, Options{}, map[string]Handler{"/t.S/Wait": func(ctx context.Context, _, dst []byte) ([]byte, error) {
		close(started)
		select {
		case <-ctx.Done():
			if ctx.Err() == nil {
				t.Error("Done closed but Err is nil")
			}
			close(canceled)
		case <-time.After(5 * time.Second):
			t.Error("handler context not canceled within 5 s of the client's cancel")
		}
		return dst, nil
	}})
	cc := dial(t, ts.addr)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	if _, err := call(ctx, cc, "/t.S/Wait", []byte("x")); status.Code(err) != codes.Canceled {
		t.Fatalf("err = %v, want Canceled", err)
	}
	select {
	case <-canceled:
	case <-time.After(5 * time.Second):
		t.Fatal("handler never saw the cancel")
	}
}

func TestGracefulStopAnswersCallsInFlight(t *testing.T) {
	release := make(chan struct{})
	inHandler := make(chan struct{}, 1)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{})
	s.Handle("/t.S/Slow", func(_ context.Context, req, dst []byte) ([]byte, error) {
		inHandler <- struct{}{}
		<-release
		return append(dst, req...), nil
	})
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	cc := dial(t, l.Addr().String())
	got := make(chan error, 1)
	go func() {
		out, err := call(context.Background(), cc, "/t.S/Slow", []byte("in flight"))
		if err == nil && string(out) != "in flight" {
			err = fmt.Errorf("answer %q", out)
		}
		got <- err
	}()
	<-inHandler
	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()
	// GracefulStop has closed the listener and sent GOAWAY once every
	// connection is marked gone away; from there it can only wait.
	waitFor(t, "GracefulStop to send GOAWAY", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.stopping || len(s.conns) == 0 {
			return false
		}
		for c := range s.conns {
			c.smu.Lock()
			gone := c.goneAway
			c.smu.Unlock()
			if !gone {
				return false
			}
		}
		return true
	})
	if _, err := net.DialTimeout("tcp", l.Addr().String(), time.Second); err == nil {
		t.Error("listener still accepting after GracefulStop")
	}
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with a call in flight")
	default:
	}
	close(release)
	if err := <-got; err != nil {
		t.Fatalf("call in flight: %v", err)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("GracefulStop did not return after the last call")
	}
	if err := <-served; !errors.Is(err, ErrServerStopped) {
		t.Fatalf("Serve: %v", err)
	}
}

func TestMaxConnectionAgeIsTransparent(t *testing.T) {
	ts := serve(t, Options{MaxConnectionAge: 50 * time.Millisecond, MaxConnectionAgeGrace: time.Second}, map[string]Handler{"/t.S/Echo": echo})
	cc := dial(t, ts.addr)
	// Call until the client has been through three connection ages (four
	// connections accepted) and made at least 20 calls, however long the
	// machine takes; every call must succeed.
	deadline := time.Now().Add(waitBound)
	n := 0
	for ; n < 20 || ts.s.Stats().Accepted < 4; n++ {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls on %d connections in %v: want 20 calls across 4 connections", n, ts.s.Stats().Accepted, waitBound)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		out, err := call(ctx, cc, "/t.S/Echo", []byte("ab"), grpc.WaitForReady(true))
		cancel()
		if err != nil || string(out) != "ba" {
			t.Fatalf("call %d across connection ages: %q, %v", n, out, err)
		}
	}
}

// raw is a hand-driven HTTP/2 client for what grpc-go never sends.
type raw struct {
	t   *testing.T
	c   net.Conn
	fr  *http2.Framer
	enc *hpack.Encoder
	buf bytes.Buffer
}

func dialRaw(t *testing.T, addr string, settings ...http2.Setting) *raw {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, clientPreface); err != nil {
		t.Fatal(err)
	}
	r := &raw{t: t, c: c, fr: http2.NewFramer(c, c)}
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	r.enc = hpack.NewEncoder(&r.buf)
	if err := r.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *raw) headers(id uint32, path, ct string, end bool) {
	r.t.Helper()
	r.buf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "x"}, {"content-type", ct}, {"te", "trailers"}} {
		_ = r.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.buf.Bytes(), EndHeaders: true, EndStream: end}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *raw) message(id uint32, msg []byte) {
	r.t.Helper()
	b := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	if err := r.fr.WriteData(id, true, append(b, msg...)); err != nil {
		r.t.Fatal(err)
	}
}

// until reads frames until f returns true; it fails on EOF or timeout.
func (r *raw) until(what string, f func(http2.Frame) bool) {
	r.t.Helper()
	for {
		fr, err := r.fr.ReadFrame()
		if err != nil {
			r.t.Fatalf("waiting for %s: %v", what, err)
		}
		if f(fr) {
			return
		}
	}
}

func TestRawProtocol(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	ts := serve(t, Options{MaxConcurrentStreams: 2, ControlFramesPerSecond: 20}, map[string]Handler{
		"/t.S/Echo":  echo,
		"/t.S/Block": func(_ context.Context, _, dst []byte) ([]byte, error) { <-block; return dst, nil },
	})

	t.Run("settings ack, ping ack, and an answer", func(t *testing.T) {
		r := dialRaw(t, ts.addr)
		r.until("server SETTINGS", func(f http2.Frame) bool {
			s, ok := f.(*http2.SettingsFrame)
			if ok && !s.IsAck() {
				if v, _ := s.Value(http2.SettingMaxConcurrentStreams); v != 2 {
					t.Errorf("MAX_CONCURRENT_STREAMS %d, want 2", v)
				}
				return true
			}
			return false
		})
		r.until("SETTINGS ack", func(f http2.Frame) bool { s, ok := f.(*http2.SettingsFrame); return ok && s.IsAck() })
		_ = r.fr.WritePing(false, [8]byte{1, 2, 3})
		r.until("PING ack", func(f http2.Frame) bool {
			p, ok := f.(*http2.PingFrame)
			return ok && p.IsAck() && p.Data == [8]byte{1, 2, 3}
		})
		r.headers(1, "/t.S/Echo", "application/grpc", false)
		r.message(1, []byte("abc"))
		var data []byte
		r.until("trailers", func(f http2.Frame) bool {
			switch f := f.(type) {
			case *http2.DataFrame:
				data = append(data, f.Data()...)
			case *http2.MetaHeadersFrame:
				if f.StreamEnded() {
					if f.StreamID != 1 || headerValue(f, "grpc-status") != "0" {
						t.Errorf("trailers %v", f.Fields)
					}
					return true
				}
				if f.PseudoValue("status") != "200" || headerValue(f, "content-type") != "application/grpc" {
					t.Errorf("headers %v", f.Fields)
				}
			}
			return false
		})
		if !bytes.Equal(data, []byte{0, 0, 0, 0, 3, 'c', 'b', 'a'}) {
			t.Errorf("answer body %q", data)
		}
	})

	t.Run("wrong content-type is HTTP 415", func(t *testing.T) {
		r := dialRaw(t, ts.addr)
		r.headers(1, "/t.S/Echo", "application/json", true)
		r.until("415", func(f http2.Frame) bool {
			h, ok := f.(*http2.MetaHeadersFrame)
			if !ok {
				return false
			}
			if h.PseudoValue("status") != "415" || headerValue(h, "grpc-status") != "13" || !h.StreamEnded() {
				t.Errorf("answer %v", h.Fields)
			}
			return true
		})
	})

	t.Run("streams over the limit are refused, resets do not free a running call", func(t *testing.T) {
		r := dialRaw(t, ts.addr)
		r.headers(1, "/t.S/Block", "application/grpc", false)
		r.message(1, nil)
		r.headers(3, "/t.S/Block", "application/grpc", false)
		r.message(3, nil)
		// Reset both: their handlers still run, so they still count.
		_ = r.fr.WriteRSTStream(1, http2.ErrCodeCancel)
		_ = r.fr.WriteRSTStream(3, http2.ErrCodeCancel)
		r.headers(5, "/t.S/Echo", "application/grpc", false)
		r.message(5, []byte("x"))
		r.until("REFUSED_STREAM on 5", func(f http2.Frame) bool {
			rs, ok := f.(*http2.RSTStreamFrame)
			return ok && rs.StreamID == 5 && rs.ErrCode == http2.ErrCodeRefusedStream
		})
	})

	t.Run("a PING flood gets GOAWAY ENHANCE_YOUR_CALM", func(t *testing.T) {
		r := dialRaw(t, ts.addr)
		for i := 0; i < 50; i++ {
			if err := r.fr.WritePing(false, [8]byte{byte(i)}); err != nil {
				break // the server may close first
			}
		}
		r.until("GOAWAY", func(f http2.Frame) bool {
			g, ok := f.(*http2.GoAwayFrame)
			if ok && g.ErrCode != http2.ErrCodeEnhanceYourCalm {
				t.Errorf("GOAWAY %v", g.ErrCode)
			}
			return ok
		})
	})

	t.Run("PINGs that follow answers are not a flood (grpc-go's BDP probes)", func(t *testing.T) {
		r := dialRaw(t, ts.addr)
		for i := uint32(0); i < 30; i++ { // over the limit of 20 per second
			id := 2*i + 1
			r.headers(id, "/t.S/Echo", "application/grpc", false)
			r.message(id, []byte("x"))
			r.until("trailers", func(f http2.Frame) bool {
				if g, ok := f.(*http2.GoAwayFrame); ok {
					t.Fatalf("GOAWAY %v after %d calls", g.ErrCode, i)
				}
				h, ok := f.(*http2.MetaHeadersFrame)
				return ok && h.StreamEnded() && h.StreamID == id
			})
			_ = r.fr.WritePing(false, [8]byte{byte(i)})
			r.until("PING ack", func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() })
		}
	})

	t.Run("not HTTP/2 is closed", func(t *testing.T) {
		c, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, err := io.ReadAll(c); err != nil {
			t.Fatalf("want the server to close the connection, got %v", err)
		}
	})
}

func headerValue(h *http2.MetaHeadersFrame, name string) string {
	for _, f := range h.RegularFields() {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

func TestHeaderBlocksDecode(t *testing.T) {
	dec := hpack.NewDecoder(4096, nil)
	for _, tc := range []struct {
		block []byte
		want  string
	}{
		{okHeaders, ":status=200 content-type=application/grpc grpc-accept-encoding=gzip"},
		{gzipHeaders, ":status=200 content-type=application/grpc grpc-accept-encoding=gzip grpc-encoding=gzip"},
		{okTrailers, "grpc-status=0"},
		{statusTrailers(nil, 415, statusError{codes.Internal, "a%b\n"}), ":status=415 content-type=application/grpc grpc-accept-encoding=gzip grpc-status=13 grpc-message=a%25b%0A"},
	} {
		fields, err := dec.DecodeFull(tc.block)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, f := range fields {
			got = append(got, f.Name+"="+f.Value)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("decoded %q, want %q", strings.Join(got, " "), tc.want)
		}
	}
	// Integers over the prefix (RFC 7541 C.1.2: 1337 with a 5-bit prefix).
	if got := appendInt(nil, 5, 0, 1337); !bytes.Equal(got, []byte{31, 154, 10}) {
		t.Errorf("appendInt(1337) = %v", got)
	}
}

func TestParseTimeout(t *testing.T) {
	for _, ok := range []string{"1S", "20m", "99999999n", "0u"} {
		if _, err := parseTimeout(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "S", "123456789S", "10x", "-1S", "1.5S"} {
		if _, err := parseTimeout(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
