package unarygrpc

import (
	"context"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// headersWith sends a request header block made of fields as given.
func (r *raw) headersWith(id uint32, end bool, fields ...[2]string) {
	r.t.Helper()
	r.buf.Reset()
	for _, f := range fields {
		_ = r.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.buf.Bytes(), EndHeaders: true, EndStream: end}); err != nil {
		r.t.Fatal(err)
	}
}

func grpcFields(extra ...[2]string) [][2]string {
	return append([][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/t.S/Echo"}, {":authority", "x"},
		{"content-type", "application/grpc"}, {"te", "trailers"}}, extra...)
}

func without(fields [][2]string, name string) [][2]string {
	var out [][2]string
	for _, f := range fields {
		if f[0] != name {
			out = append(out, f)
		}
	}
	return out
}

// replaced sets name's value in place (pseudo-headers must come first).
func replaced(fields [][2]string, name, value string) [][2]string {
	out := append([][2]string(nil), fields...)
	for i := range out {
		if out[i][0] == name {
			out[i][1] = value
		}
	}
	return out
}

func (r *raw) rstOn(id uint32) http2.ErrCode {
	r.t.Helper()
	var code http2.ErrCode
	r.until("RST_STREAM", func(f http2.Frame) bool {
		if g, ok := f.(*http2.GoAwayFrame); ok {
			r.t.Fatalf("GOAWAY %v, want a stream error", g.ErrCode)
		}
		rs, ok := f.(*http2.RSTStreamFrame)
		if ok && rs.StreamID == id {
			code = rs.ErrCode
			return true
		}
		return false
	})
	return code
}

// RFC 9113 stream states and identifiers (5.1, 5.1.1), malformed requests
// (8.1.1, 8.2.2, 8.3.1), and the HTTP answers grpc-go gives to valid HTTP/2
// requests that are not gRPC (405 for GET and HEAD, 400 for a malformed
// grpc-timeout).
func TestRFC9113Strictness(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	ts := serve(t, Options{}, map[string]Handler{
		"/t.S/Echo":  echo,
		"/t.S/Block": func(_ context.Context, _, dst []byte) ([]byte, error) { <-block; return dst, nil },
	})
	connErr := func(t *testing.T, want http2.ErrCode, send func(r *raw)) {
		t.Helper()
		r := dialRaw(t, ts.addr)
		send(r)
		if code := readGoAway(t, r); code != want {
			t.Errorf("GOAWAY %v, want %v", code, want)
		}
	}
	answered := func(r *raw, id uint32) {
		r.until("answer", func(f http2.Frame) bool {
			h, ok := f.(*http2.MetaHeadersFrame)
			return ok && h.StreamEnded() && h.StreamID == id
		})
	}

	t.Run("DATA on an idle stream", func(t *testing.T) {
		connErr(t, http2.ErrCodeProtocol, func(r *raw) { _ = r.fr.WriteData(3, true, []byte{0, 0, 0, 0, 0}) })
	})
	t.Run("RST_STREAM on an idle stream", func(t *testing.T) {
		connErr(t, http2.ErrCodeProtocol, func(r *raw) { _ = r.fr.WriteRSTStream(5, http2.ErrCodeCancel) })
	})
	t.Run("WINDOW_UPDATE on an idle stream", func(t *testing.T) {
		connErr(t, http2.ErrCodeProtocol, func(r *raw) { _ = r.fr.WriteWindowUpdate(7, 1) })
	})
	t.Run("decreasing stream id", func(t *testing.T) {
		connErr(t, http2.ErrCodeProtocol, func(r *raw) {
			r.headersWith(5, false, grpcFields()...)
			r.headersWith(3, false, grpcFields()...)
		})
	})
	t.Run("HEADERS on a closed stream", func(t *testing.T) {
		connErr(t, http2.ErrCodeStreamClosed, func(r *raw) {
			r.headers(1, "/t.S/Echo", "application/grpc", false)
			r.message(1, []byte("x"))
			answered(r, 1)
			r.headersWith(1, true, grpcFields()...)
		})
	})
	t.Run("DATA on a closed stream is a stream error", func(t *testing.T) {
		r := dialRaw(t, ts.addr)
		r.headers(1, "/t.S/Echo", "application/grpc", false)
		r.message(1, []byte("x"))
		answered(r, 1)
		_ = r.fr.WriteData(1, true, []byte{0, 0, 0, 0, 0})
		if code := r.rstOn(1); code != http2.ErrCodeStreamClosed {
			t.Errorf("RST_STREAM %v", code)
		}
	})
	t.Run("DATA and HEADERS on a half-closed (remote) stream", func(t *testing.T) {
		r := dialRaw(t, ts.addr)
		r.headers(1, "/t.S/Block", "application/grpc", false)
		r.message(1, nil)
		_ = r.fr.WriteData(1, true, []byte{0, 0, 0, 0, 0})
		if code := r.rstOn(1); code != http2.ErrCodeStreamClosed {
			t.Errorf("DATA: RST_STREAM %v", code)
		}
		r.headers(3, "/t.S/Block", "application/grpc", false)
		r.message(3, nil)
		r.headersWith(3, true, [2]string{"x-trailer", "1"})
		if code := r.rstOn(3); code != http2.ErrCodeStreamClosed {
			t.Errorf("HEADERS: RST_STREAM %v", code)
		}
	})
	for _, tc := range []struct {
		name   string
		fields [][2]string
	}{
		{"connection header", grpcFields([2]string{"connection", "keep-alive"})},
		{"transfer-encoding", grpcFields([2]string{"transfer-encoding", "chunked"})},
		{"upgrade", grpcFields([2]string{"upgrade", "h2c"})},
		{"te: gzip", append(without(grpcFields(), "te"), [2]string{"te", "gzip"})},
		{"no :scheme", without(grpcFields(), ":scheme")},
		{"no :path", without(grpcFields(), ":path")},
		{"empty :path", replaced(grpcFields(), ":path", "")},
	} {
		t.Run("malformed: "+tc.name, func(t *testing.T) {
			r := dialRaw(t, ts.addr)
			r.headersWith(1, true, tc.fields...)
			if code := r.rstOn(1); code != http2.ErrCodeProtocol {
				t.Errorf("RST_STREAM %v, want PROTOCOL_ERROR", code)
			}
			// The connection goes on.
			r.headers(3, "/t.S/Echo", "application/grpc", false)
			r.message(3, []byte("y"))
			answered(r, 3)
		})
	}
	for _, tc := range []struct {
		name   string
		fields [][2]string
		status string
	}{
		{"GET", replaced(grpcFields(), ":method", "GET"), "405"},
		{"HEAD", replaced(grpcFields(), ":method", "HEAD"), "405"},
		{"malformed grpc-timeout", grpcFields([2]string{"grpc-timeout", "1x"}), "400"},
	} {
		t.Run(tc.name+" is HTTP "+tc.status, func(t *testing.T) {
			r := dialRaw(t, ts.addr)
			r.headersWith(1, true, tc.fields...)
			r.until(tc.status, func(f http2.Frame) bool {
				h, ok := f.(*http2.MetaHeadersFrame)
				if !ok {
					return false
				}
				if h.PseudoValue("status") != tc.status || headerValue(h, "grpc-status") != "13" || !h.StreamEnded() {
					t.Errorf("answer %v", h.Fields)
				}
				return true
			})
		})
	}
}

// After the peer's GOAWAY the calls in flight are answered, then the
// connection closes gracefully: EOF, no TCP reset, even though the peer
// sent more after its GOAWAY.
func TestPeerGoAwayDrains(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 2)
	ts := serve(t, Options{}, map[string]Handler{
		"/t.S/Block": func(_ context.Context, _, dst []byte) ([]byte, error) {
			entered <- struct{}{}
			<-release
			return append(dst, 'k'), nil
		},
	})
	r := dialRaw(t, ts.addr)
	r.headers(1, "/t.S/Block", "application/grpc", false)
	r.message(1, nil)
	r.headers(3, "/t.S/Block", "application/grpc", false)
	r.message(3, nil)
	<-entered // both calls are in flight before the GOAWAY
	<-entered
	if err := r.fr.WriteGoAway(3, http2.ErrCodeNo, nil); err != nil {
		t.Fatal(err)
	}
	// Once this PING is acked the server has handled the GOAWAY while both
	// calls were still running.
	r.barrier([8]byte{99}, nil)
	for i := 0; i < 5; i++ {
		_ = r.fr.WritePing(false, [8]byte{byte(i)}) // unread input at close time would mean a reset
	}
	close(release)
	done := map[uint32]bool{}
	r.until("both answers", func(f http2.Frame) bool {
		if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamEnded() {
			if headerValue(h, "grpc-status") != "0" {
				t.Errorf("stream %d: %v", h.StreamID, h.Fields)
			}
			done[h.StreamID] = true
		}
		return len(done) == 2
	})
	// The server closes on its own, gracefully.
	var buf [512]byte
	for {
		_, err := r.c.Read(buf[:])
		if err == nil {
			continue
		}
		if err.Error() != "EOF" {
			t.Fatalf("after the answers: %v, want EOF", err)
		}
		break
	}
}

// A content-length that does not match the DATA received makes the request
// malformed (RFC 9113 8.1.1): a stream error. One that matches is fine.
func TestContentLength(t *testing.T) {
	ts := serve(t, Options{}, map[string]Handler{"/t.S/Echo": echo})
	body := []byte{0, 0, 0, 0, 2, 'a', 'b'}
	for _, tc := range []struct {
		name   string
		length string
		chunks [][]byte
		ok     bool
	}{
		{"matches", "7", [][]byte{body}, true},
		{"matches over two frames", "7", [][]byte{body[:3], body[3:]}, true},
		{"shorter body", "8", [][]byte{body}, false},
		{"longer body", "6", [][]byte{body}, false},
		{"longer over two frames", "5", [][]byte{body[:3], body[3:]}, false},
		{"not a number", "x", [][]byte{body}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRaw(t, ts.addr)
			r.headersWith(1, false, grpcFields([2]string{"content-length", tc.length})...)
			for i, c := range tc.chunks {
				_ = r.fr.WriteData(1, i == len(tc.chunks)-1, c)
			}
			r.until("the end of stream 1", func(f http2.Frame) bool {
				switch f := f.(type) {
				case *http2.RSTStreamFrame:
					if tc.ok || f.ErrCode != http2.ErrCodeProtocol {
						t.Errorf("RST_STREAM %v", f.ErrCode)
					}
					return true
				case *http2.MetaHeadersFrame:
					if f.StreamEnded() {
						if !tc.ok || headerValue(f, "grpc-status") != "0" {
							t.Errorf("answered %v", f.Fields)
						}
						return true
					}
				}
				return false
			})
		})
	}
}
