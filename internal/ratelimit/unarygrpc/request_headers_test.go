package unarygrpc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// headerFrames writes block as a HEADERS frame on stream 1, split into
// CONTINUATION frames at the given offsets.
func headerFrames(t testing.TB, block []byte, endStream bool, splits ...int) []byte {
	var buf bytes.Buffer
	writeBlock(t, http2.NewFramer(&buf, nil), 1, block, endStream, splits...)
	return buf.Bytes()
}

func writeBlock(t testing.TB, fr *http2.Framer, id uint32, block []byte, endStream bool, splits ...int) {
	var parts [][]byte
	last := 0
	for _, s := range splits {
		if s > last && s < len(block) {
			parts = append(parts, block[last:s])
			last = s
		}
	}
	parts = append(parts, block[last:])
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: parts[0], EndStream: endStream, EndHeaders: len(parts) == 1}); err != nil {
		t.Fatal(err)
	}
	for i, p := range parts[1:] {
		if err := fr.WriteContinuation(id, i == len(parts)-2, p); err != nil {
			t.Fatal(err)
		}
	}
}

// writeBadPadding writes a HEADERS frame whose pad length passes its
// payload and that does not end its block (the framer refuses it as a
// stream error after it already expects a CONTINUATION), then the
// CONTINUATION that ends the block, carrying frag.
func writeBadPadding(t testing.TB, fr *http2.Framer, id uint32, frag []byte) {
	if err := fr.WriteRawFrame(http2.FrameHeaders, http2.FlagHeadersPadded, id, []byte{5}); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteContinuation(id, true, frag); err != nil {
		t.Fatal(err)
	}
}

// blockOutcome is what a reader made of a header block: its fields, or the
// error it raised (a stream error or a connection error, with its code), or
// a CONTINUATION it ignored.
type blockOutcome struct {
	Fields    []hpack.HeaderField
	Truncated bool
	EndStream bool
	Stream    bool
	Conn      bool
	Ignored   bool
	ID        uint32
	Code      http2.ErrCode
}

// framerErr is a frame refused by the framer itself: a stream error (read
// on) or a connection error (the end).
func framerErr(err error) (blockOutcome, bool) {
	var se http2.StreamError
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &se):
		return blockOutcome{Stream: true, ID: se.StreamID, Code: se.Code}, true
	case errors.As(err, &ce):
		return blockOutcome{Conn: true, Code: http2.ErrCode(ce)}, false
	}
	return blockOutcome{Conn: true, Code: 0xff}, false
}

// readOutcomes reads every frame of fr: a frame the framer refuses is an
// outcome (reading goes on after a stream error), any other frame goes to
// each, which adds its outcomes and says whether reading goes on.
func readOutcomes(fr *http2.Framer, each func(f http2.Frame, out []blockOutcome) ([]blockOutcome, bool)) []blockOutcome {
	var out []blockOutcome
	for more := true; more; {
		f, err := fr.ReadFrame()
		switch {
		case errors.Is(err, io.EOF):
			return out
		case err != nil:
			var o blockOutcome
			o, more = framerErr(err)
			out = append(out, o)
		default:
			out, more = each(f, out)
		}
	}
	return out
}

// framerOutcome reads frames with x/net's own header block decoding
// (ReadMetaHeaders): the behaviour headerBlock keeps.
func framerOutcome(frames []byte, maxList uint32) []blockOutcome {
	fr := http2.NewFramer(nil, bytes.NewReader(frames))
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = maxList
	return readOutcomes(fr, func(f http2.Frame, out []blockOutcome) ([]blockOutcome, bool) {
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			return append(out, blockOutcome{Fields: f.Fields, Truncated: f.Truncated, EndStream: f.StreamEnded(), ID: f.StreamID}), true
		case *http2.ContinuationFrame:
			return append(out, blockOutcome{Ignored: true, ID: f.StreamID}), true
		}
		return append(out, blockOutcome{Conn: true, Code: 0xfe}), false
	})
}

// ourOutcome reads the same frames as the connection does: raw frames from
// the framer, the block from headerBlock.
func ourOutcome(frames []byte, maxList uint32) []blockOutcome {
	fr := http2.NewFramer(nil, bytes.NewReader(frames))
	b := newHeaderBlock(maxList)
	return readOutcomes(fr, func(f http2.Frame, out []blockOutcome) ([]blockOutcome, bool) {
		var h *requestHeaders
		var berr *blockError
		switch f := f.(type) {
		case *http2.HeadersFrame:
			b.start(f)
			h, berr = b.add(f.HeaderBlockFragment(), f.HeadersEnded())
		case *http2.ContinuationFrame:
			wasOpen := b.open
			h, berr = b.add(f.HeaderBlockFragment(), f.HeadersEnded())
			if !wasOpen && h == nil && berr == nil {
				return append(out, blockOutcome{Ignored: true, ID: f.StreamID}), true
			}
		default:
			return append(out, blockOutcome{Conn: true, Code: 0xfe}), false
		}
		switch {
		case berr != nil && berr.stream:
			return append(out, blockOutcome{Stream: true, ID: b.h.StreamID, Code: berr.code}), true
		case berr != nil:
			return append(out, blockOutcome{Conn: true, Code: berr.code}), false
		case h != nil:
			// Fields are reused by the next block: keep a copy.
			return append(out, blockOutcome{Fields: append([]hpack.HeaderField(nil), h.Fields...), Truncated: h.Truncated, EndStream: h.StreamEnded(), ID: h.StreamID}), true
		}
		return out, true
	})
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
			for _, o := range ourOutcome(headerFrames(t, block, true), maxList) {
				seen[fmt.Sprintf("stream=%v conn=%v code=%v truncated=%v", o.Stream, o.Conn, o.Code, o.Truncated)] = true
			}
		}
	}
	for _, want := range []string{"stream=false conn=false code=NO_ERROR truncated=false", "stream=false conn=false code=NO_ERROR truncated=true",
		"stream=true conn=false code=PROTOCOL_ERROR truncated=false", "stream=false conn=true code=COMPRESSION_ERROR truncated=false"} {
		if !seen[want] {
			t.Errorf("no case reaches %s (seen %v)", want, seen)
		}
	}
}

// TestHeaderBlockSequencesMatchFramer: blocks read one after the other on
// one connection (the HPACK table carried from block to block, a refused or
// truncated block followed by a good one, a CONTINUATION after a HEADERS
// frame the framer refused) get the framer's outcomes, block by block.
func TestHeaderBlockSequencesMatchFramer(t *testing.T) {
	cases := headerBlockCases()
	good := encodeBlock(grpcRequest()...)
	for name, block := range cases {
		for _, bad := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/badPadding=%v", name, bad), func(t *testing.T) {
				var buf bytes.Buffer
				fr := http2.NewFramer(&buf, nil)
				writeBlock(t, fr, 1, good, false)
				if bad {
					writeBadPadding(t, fr, 3, block)
				}
				writeBlock(t, fr, 5, block, true, 9)
				writeBlock(t, fr, 7, good, true)
				for _, maxList := range []uint32{DefaultMaxHeaderListSize, 400} {
					want, got := framerOutcome(buf.Bytes(), maxList), ourOutcome(buf.Bytes(), maxList)
					if !reflect.DeepEqual(want, got) {
						t.Fatalf("max %d\nx/net: %+v\nours:  %+v", maxList, want, got)
					}
				}
			})
		}
	}
}

// FuzzHeaderBlockMatchesFramer: any two header blocks, the first split
// anywhere into CONTINUATION frames, with or without a refused HEADERS
// frame and its CONTINUATION between them, get the framer's outcomes.
func FuzzHeaderBlockMatchesFramer(f *testing.F) {
	for _, block := range headerBlockCases() {
		f.Add(block, uint16(0), uint16(0), uint16(400), uint8(0))
	}
	two := append(encodeBlock(grpcRequest()...), encodeBlock(grpcRequest(hf("x-b", "2"))...)...)
	f.Add(two, uint16(40), uint16(3), uint16(120), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, cut, split, maxList uint16, mode uint8) {
		if len(data) > 4096 {
			return
		}
		k := 0
		if len(data) > 0 {
			k = int(cut) % (len(data) + 1)
		}
		var buf bytes.Buffer
		fr := http2.NewFramer(&buf, nil)
		writeBlock(t, fr, 1, data[:k], mode&1 == 0, int(split))
		if mode&2 != 0 {
			writeBadPadding(t, fr, 3, data[k:])
		}
		writeBlock(t, fr, 5, data[k:], true)
		limit := uint32(maxList) + 1
		want, got := framerOutcome(buf.Bytes(), limit), ourOutcome(buf.Bytes(), limit)
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

// TestContinuationAfterRefusedHeaders: on a live connection, a HEADERS frame
// the framer refuses (its pad length passes its payload) and the
// CONTINUATION that follows it reset that stream only; the call in flight
// on the connection is answered and the connection stays up.
func TestContinuationAfterRefusedHeaders(t *testing.T) {
	ts := serve(t, Options{}, map[string]Handler{"/t.S/Echo": echo})
	r := dialRaw(t, ts.addr)
	r.headers(1, "/t.S/Echo", "application/grpc", false)
	writeBadPadding(t, r.fr, 3, nil)
	r.message(1, []byte("ab"))
	var reset3 bool
	r.until("stream 1's answer", func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v: the connection was closed", f.ErrCode)
		case *http2.RSTStreamFrame:
			if f.StreamID != 3 || f.ErrCode != http2.ErrCodeProtocol {
				t.Fatalf("RST_STREAM %d %v, want only stream 3 PROTOCOL_ERROR", f.StreamID, f.ErrCode)
			}
			reset3 = true
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 && f.StreamEnded() {
				if st := headerValue(f, "grpc-status"); st != "0" {
					t.Fatalf("stream 1 ended with grpc-status %q", st)
				}
				return true
			}
		}
		return false
	})
	if !reset3 {
		t.Fatal("stream 3 was not reset")
	}
}
