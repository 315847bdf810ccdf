package main

import (
	"bufio"
	"bytes"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// respStream is n gRPC answers as a server writes them (headers, one DATA
// frame, trailers), HPACK-indexed like grpc-go's server.
func respStream(n int) []byte {
	var out bytes.Buffer
	fr := http2.NewFramer(&out, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i := 0; i < n; i++ {
		id := uint32(2*i + 1)
		hb.Reset()
		enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
		enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: bytes.Clone(hb.Bytes()), EndHeaders: true})
		fr.WriteData(id, false, []byte{0, 0, 0, 0, 2, 8, 1})
		hb.Reset()
		enc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "0"})
		enc.WriteField(hpack.HeaderField{Name: "grpc-message", Value: ""})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: bytes.Clone(hb.Bytes()), EndHeaders: true, EndStream: true})
	}
	return out.Bytes()
}

// TestHeaderDecode: the reader's own HPACK decoding sees :status and
// grpc-status of every block, including the indexed repeats.
func TestHeaderDecode(t *testing.T) {
	c := &h2Client{}
	c.fr = http2.NewFramer(nil, bufio.NewReader(bytes.NewReader(respStream(3))))
	c.hdec = hpack.NewDecoder(4096, c.emit)
	var got []string
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			break
		}
		if h, ok := f.(*http2.HeadersFrame); ok {
			c.hStatus, c.hGRPCState = "", ""
			if _, err := c.hdec.Write(h.HeaderBlockFragment()); err != nil {
				t.Fatal(err)
			}
			if err := c.hdec.Close(); err != nil {
				t.Fatal(err)
			}
			got = append(got, c.hStatus+"/"+c.hGRPCState)
		}
	}
	want := []string{"200/", "/0", "200/", "/0", "200/", "/0"}
	if len(got) != len(want) {
		t.Fatalf("blocks %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("block %d: %q, want %q", i, got[i], want[i])
		}
	}
}

// BenchmarkHeaders compares x/net's MetaHeadersFrame decoding (what the
// generator used before) with the reader's own decoder, per answer.
func BenchmarkHeaders(b *testing.B) {
	const n = 1000
	data := respStream(n)
	b.Run("meta", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i += n {
			fr := http2.NewFramer(nil, bufio.NewReader(bytes.NewReader(data)))
			fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					break
				}
				if m, ok := f.(*http2.MetaHeadersFrame); ok {
					_ = m.PseudoValue("status")
					for _, hf := range m.Fields {
						if hf.Name == "grpc-status" {
							_ = hf.Value
						}
					}
				}
			}
		}
	})
	b.Run("raw", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i += n {
			c := &h2Client{}
			c.fr = http2.NewFramer(nil, bufio.NewReader(bytes.NewReader(data)))
			c.hdec = hpack.NewDecoder(4096, c.emit)
			for {
				f, err := c.fr.ReadFrame()
				if err != nil {
					break
				}
				if h, ok := f.(*http2.HeadersFrame); ok {
					c.hdec.Write(h.HeaderBlockFragment())
					c.hdec.Close()
				}
			}
		}
	})
}
