package unarygrpc

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// headerFrames writes block as a HEADERS frame on stream 1, split into
// CONTINUATION frames at the given offsets.
func headerFrames(t testing.TB, block []byte, endStream bool, splits ...int) []byte {
	var buf bytes.Buffer
	fr := http2.NewFramer(&buf, nil)
	var parts [][]byte
	last := 0
	for _, s := range splits {
		if s > last && s < len(block) {
			parts = append(parts, block[last:s])
			last = s
		}
	}
	parts = append(parts, block[last:])
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: parts[0], EndStream: endStream, EndHeaders: len(parts) == 1}); err != nil {
		t.Fatal(err)
	}
	for i, p := range parts[1:] {
		if err := fr.WriteContinuation(1, i == len(parts)-2, p); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// blockOutcome is what a reader made of a header block: its fields, or the
// error it raised (a stream error or a connection error, with its code).
type blockOutcome struct {
	Fields    []hpack.HeaderField
	Truncated bool
	EndStream bool
	Stream    bool
	Conn      bool
	Code      http2.ErrCode
}

// framerOutcome reads frames with x/net's own header block decoding
// (ReadMetaHeaders): the behaviour headerBlock keeps.
func framerOutcome(frames []byte, maxList uint32) blockOutcome {
	fr := http2.NewFramer(nil, bytes.NewReader(frames))
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = maxList
	f, err := fr.ReadFrame()
	var se http2.StreamError
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &se):
		return blockOutcome{Stream: true, Code: se.Code}
	case errors.As(err, &ce):
		return blockOutcome{Conn: true, Code: http2.ErrCode(ce)}
	case err != nil:
		return blockOutcome{Conn: true, Code: 0xff}
	}
	mh := f.(*http2.MetaHeadersFrame)
	return blockOutcome{Fields: mh.Fields, Truncated: mh.Truncated, EndStream: mh.StreamEnded()}
}

// ourOutcome reads the same frames as the connection does: raw frames from
// the framer, the block from headerBlock.
func ourOutcome(frames []byte, maxList uint32) blockOutcome {
	fr := http2.NewFramer(nil, bytes.NewReader(frames))
	b := newHeaderBlock(maxList)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				return blockOutcome{Conn: true, Code: http2.ErrCode(ce)}
			}
			return blockOutcome{Conn: true, Code: 0xff}
		}
		var h *requestHeaders
		var berr *blockError
		switch f := f.(type) {
		case *http2.HeadersFrame:
			b.start(f)
			h, berr = b.add(f.HeaderBlockFragment(), f.HeadersEnded())
		case *http2.ContinuationFrame:
			h, berr = b.add(f.HeaderBlockFragment(), f.HeadersEnded())
		default:
			return blockOutcome{Conn: true, Code: 0xfe}
		}
		if berr != nil {
			if berr.stream {
				return blockOutcome{Stream: true, Code: berr.code}
			}
			return blockOutcome{Conn: true, Code: berr.code}
		}
		if h != nil {
			return blockOutcome{Fields: h.Fields, Truncated: h.Truncated, EndStream: h.StreamEnded()}
		}
	}
}

func encodeBlock(fields ...hpack.HeaderField) []byte {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, f := range fields {
		_ = enc.WriteField(f)
	}
	return buf.Bytes()
}

func hf(name, value string) hpack.HeaderField { return hpack.HeaderField{Name: name, Value: value} }

// grpcRequest is the header block a gRPC client sends for a call.
func grpcRequest(extra ...hpack.HeaderField) []hpack.HeaderField {
	return append([]hpack.HeaderField{hf(":method", "POST"), hf(":scheme", "http"), hf(":path", methodPath),
		hf(":authority", "ratelimit:8081"), hf("content-type", "application/grpc"), hf("te", "trailers"),
		hf("grpc-timeout", "20m"), hf("user-agent", "envoy")}, extra...)
}

const methodPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

func headerBlockCases() map[string][]byte {
	long := string(bytes.Repeat([]byte("v"), 300))
	return map[string][]byte{
		"grpc request":         encodeBlock(grpcRequest()...),
		"upper case name":      encodeBlock(grpcRequest(hf("X-Upper", "1"))...),
		"pseudo after regular": encodeBlock(append(grpcRequest(), hf(":path", "/late"))...),
		"invalid value":        encodeBlock(grpcRequest(hf("x-bad", "a\x00b"))...),
		"unknown pseudo":       encodeBlock(append([]hpack.HeaderField{hf(":bogus", "1")}, grpcRequest()...)...),
		"duplicate pseudo":     encodeBlock(append([]hpack.HeaderField{hf(":method", "GET")}, grpcRequest()...)...),
		"response pseudo":      encodeBlock(append([]hpack.HeaderField{hf(":status", "200")}, grpcRequest()...)...),
		"over the list size":   encodeBlock(grpcRequest(hf("x-long", long), hf("x-long-2", long))...),
		"empty name":           encodeBlock(hf("", "x")),
		"truncated hpack":      encodeBlock(grpcRequest()...)[:20],
		"bad hpack index":      {0xff, 0xff, 0xff, 0x7f},
		"empty block":          {},
	}
}

// TestHeaderBlockMatchesFramer: for valid and refused header blocks, split
// or not into CONTINUATION frames, headerBlock yields what x/net's framer
// yields with ReadMetaHeaders: the same fields, or the same stream or
// connection error code.
func TestHeaderBlockMatchesFramer(t *testing.T) {
	for name, block := range headerBlockCases() {
		for _, splits := range [][]int{nil, {1}, {7, 30}, {len(block) / 2}} {
			for _, maxList := range []uint32{DefaultMaxHeaderListSize, 400} {
				t.Run(fmt.Sprintf("%s/split%v/max%d", name, splits, maxList), func(t *testing.T) {
					frames := headerFrames(t, block, true, splits...)
					want, got := framerOutcome(frames, maxList), ourOutcome(frames, maxList)
					if !reflect.DeepEqual(want, got) {
						t.Fatalf("x/net: %+v\nours:  %+v", want, got)
					}
				})
			}
		}
	}
	// The cases above reach every outcome.
	seen := map[string]bool{}
	for _, block := range headerBlockCases() {
		for _, maxList := range []uint32{DefaultMaxHeaderListSize, 400} {
			o := ourOutcome(headerFrames(t, block, true), maxList)
			seen[fmt.Sprintf("stream=%v conn=%v code=%v truncated=%v", o.Stream, o.Conn, o.Code, o.Truncated)] = true
		}
	}
	for _, want := range []string{"stream=false conn=false code=NO_ERROR truncated=false", "stream=false conn=false code=NO_ERROR truncated=true",
		"stream=true conn=false code=PROTOCOL_ERROR truncated=false", "stream=false conn=true code=COMPRESSION_ERROR truncated=false"} {
		if !seen[want] {
			t.Errorf("no case reaches %s (seen %v)", want, seen)
		}
	}
}

// FuzzHeaderBlockMatchesFramer: any header block, split anywhere into
// CONTINUATION frames, gets the framer's outcome.
func FuzzHeaderBlockMatchesFramer(f *testing.F) {
	for _, block := range headerBlockCases() {
		f.Add(block, uint16(0), uint16(0), uint16(400))
	}
	f.Add(encodeBlock(grpcRequest()...), uint16(3), uint16(40), uint16(120))
	f.Fuzz(func(t *testing.T, block []byte, s1, s2, maxList uint16) {
		if len(block) > 4096 {
			return
		}
		frames := headerFrames(t, block, s1%2 == 0, int(s1), int(s2))
		limit := uint32(maxList) + 1
		want, got := framerOutcome(frames, limit), ourOutcome(frames, limit)
		if !reflect.DeepEqual(want, got) {
			t.Fatalf("x/net: %+v\nours:  %+v", want, got)
		}
	})
}

// TestHeaderBlockAllocations: a gRPC request's header block, once the
// client's HPACK table holds its fields, decodes without allocating.
func TestHeaderBlockAllocations(t *testing.T) {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	write := func() []byte {
		buf.Reset()
		for _, f := range grpcRequest() {
			_ = enc.WriteField(f)
		}
		return append([]byte(nil), buf.Bytes()...)
	}
	first, again := write(), write() // again: all indexed
	b := newHeaderBlock(DefaultMaxHeaderListSize)
	fr := http2.NewFramer(nil, bytes.NewReader(headerFrames(t, first, true)))
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	hdr := f.(*http2.HeadersFrame)
	b.start(hdr)
	if h, berr := b.add(hdr.HeaderBlockFragment(), true); berr != nil || h == nil || h.PseudoValue("path") != methodPath {
		t.Fatalf("first block: %v %v", h, berr)
	}
	want := len(grpcRequest())
	n := testing.AllocsPerRun(100, func() {
		b.start(hdr)
		h, berr := b.add(again, true)
		if berr != nil || len(h.Fields) != want {
			t.Fatalf("block: %v %v", h, berr)
		}
	})
	if n != 0 {
		t.Fatalf("a request's header block allocates %.0f times", n)
	}
}
