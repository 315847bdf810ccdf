package unarygrpc

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

func gz(t testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, _ = zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestGunzipBound(t *testing.T) {
	plain := bytes.Repeat([]byte("0123456789"), 1000)
	out, err := gunzip(nil, gz(t, plain), len(plain))
	if err != nil || !bytes.Equal(out, plain) {
		t.Fatalf("at the bound: %d bytes, %v", len(out), err)
	}
	// 1 GiB of zeros would inflate from about 1 MB; a few KB of a bomb is
	// enough to show the output stops at the bound.
	bomb := gz(t, make([]byte, 4<<20))
	out, err = gunzip(nil, bomb, 1<<20)
	if !errors.Is(err, errDecompressedTooLarge) {
		t.Fatalf("bomb: %v", err)
	}
	if cap(out) > 1<<20+1 {
		t.Errorf("allocated %d bytes for a %d-byte bound", cap(out), 1<<20)
	}
	if _, err := gunzip(nil, []byte("not gzip"), 100); err == nil {
		t.Error("garbage decompressed")
	}
}

// rawCall sends one request with the given grpc-encoding and message
// (flag byte included) and returns the answer's headers, body and trailers.
func rawCall(t *testing.T, addr, enc string, flag byte, msg []byte) (hdr, trl map[string]string, body []byte) {
	t.Helper()
	r := dialRaw(t, addr)
	r.buf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/t.S/Echo"}, {":authority", "x"},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"grpc-encoding", enc}} {
		_ = r.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.buf.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	b := []byte{flag, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	if err := r.fr.WriteData(1, true, append(b, msg...)); err != nil {
		t.Fatal(err)
	}
	fields := func(h *http2.MetaHeadersFrame) map[string]string {
		m := map[string]string{}
		for _, f := range h.Fields {
			m[f.Name] = f.Value
		}
		return m
	}
	r.until("trailers", func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.DataFrame:
			body = append(body, f.Data()...)
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				trl = fields(f)
				if hdr == nil {
					hdr = trl // trailers-only
				}
				return true
			}
			hdr = fields(f)
		}
		return false
	})
	return hdr, trl, body
}

// The wire form of gzip as grpc-go answers it: compressed answers to a
// client that sent grpc-encoding gzip, grpc-accept-encoding advertised, an
// unknown encoding refused with Unimplemented, a corrupt message Internal.
func TestGzipOnTheWire(t *testing.T) {
	ts := serve(t, Options{}, map[string]Handler{"/t.S/Echo": echo})
	req := bytes.Repeat([]byte("abc"), 100)

	hdr, trl, body := rawCall(t, ts.addr, "gzip", 1, gz(t, req))
	if hdr["grpc-encoding"] != "gzip" || hdr["grpc-accept-encoding"] != "gzip" || trl["grpc-status"] != "0" {
		t.Fatalf("headers %v trailers %v", hdr, trl)
	}
	if len(body) < 5 || body[0] != 1 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
		t.Fatalf("answer is not one compressed message: % x", body[:min(len(body), 8)])
	}
	zr, err := gzip.NewReader(bytes.NewReader(body[5:]))
	if err != nil {
		t.Fatal(err)
	}
	var plain bytes.Buffer
	if _, err := plain.ReadFrom(zr); err != nil || !bytes.Equal(plain.Bytes(), reversed(req)) {
		t.Fatalf("answer decompresses to %q, %v", plain.Bytes(), err)
	}

	// Not compressed at all: no grpc-encoding on the answer.
	hdr, _, body = rawCall(t, ts.addr, "identity", 0, req)
	if _, ok := hdr["grpc-encoding"]; ok || hdr["grpc-accept-encoding"] != "gzip" || body[0] != 0 {
		t.Errorf("identity: headers %v, flag %d", hdr, body[0])
	}

	_, trl, _ = rawCall(t, ts.addr, "snappy", 1, []byte("xxxx"))
	if trl["grpc-status"] != "12" || trl["grpc-accept-encoding"] != "gzip" {
		t.Errorf("unknown encoding: %v", trl)
	}
	_, trl, _ = rawCall(t, ts.addr, "gzip", 1, []byte("not gzip at all"))
	if trl["grpc-status"] != "13" {
		t.Errorf("corrupt gzip: %v", trl)
	}
}

// FuzzGunzip: any input either decompresses within the bound or fails;
// the output never exceeds the bound and nothing panics.
func FuzzGunzip(f *testing.F) {
	f.Add(gz(f, []byte("hello")), 100)
	f.Add(gz(f, make([]byte, 10000)), 1000)
	f.Add([]byte("\x1f\x8b\x08\x00garbage"), 10)
	f.Fuzz(func(t *testing.T, in []byte, limit int) {
		if limit < 0 || limit > 1<<20 {
			return
		}
		out, err := gunzip(nil, in, limit)
		if err == nil && len(out) > limit {
			t.Fatalf("%d bytes out for a %d-byte bound", len(out), limit)
		}
		if cap(out) > limit+1 && cap(out) > 512 {
			t.Fatalf("allocated %d bytes for a %d-byte bound", cap(out), limit)
		}
	})
}
