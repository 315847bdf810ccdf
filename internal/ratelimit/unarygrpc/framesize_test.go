package unarygrpc

import (
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// writeFrameHeader writes a raw frame header: the framer refuses to write
// frames larger than 16 MiB - 1, and a probe needs to lie about the length.
func writeFrameHeader(t *testing.T, w io.Writer, length uint32, typ http2.FrameType, stream uint32) {
	t.Helper()
	h := []byte{byte(length >> 16), byte(length >> 8), byte(length), byte(typ), 0,
		byte(stream >> 24), byte(stream >> 16), byte(stream >> 8), byte(stream)}
	if _, err := w.Write(h); err != nil {
		t.Fatal(err)
	}
}

// readGoAway reads frames until GOAWAY and returns its code; then the
// connection must end with EOF (a graceful close), not a reset.
func readGoAway(t *testing.T, r *raw) http2.ErrCode {
	t.Helper()
	var code http2.ErrCode
	r.until("GOAWAY", func(f http2.Frame) bool {
		g, ok := f.(*http2.GoAwayFrame)
		if ok {
			code = g.ErrCode
		}
		return ok
	})
	var buf [512]byte
	for {
		_, err := r.c.Read(buf[:])
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) {
			t.Errorf("after GOAWAY: %v, want EOF (a TCP reset can destroy the GOAWAY)", err)
		}
		return code
	}
}

// The server advertises no SETTINGS_MAX_FRAME_SIZE, so 16,384 is the
// largest frame a peer may send: a frame of exactly that size is fine, one
// byte more is a FRAME_SIZE_ERROR connection error (RFC 9113 4.2).
func TestFrameSizeLimit(t *testing.T) {
	ts := serve(t, Options{}, map[string]Handler{"/t.S/Echo": echo})

	r := dialRaw(t, ts.addr)
	writeFrameHeader(t, r.c, defaultFrameSize, 0xfe, 0) // unknown type: ignored
	if _, err := r.c.Write(make([]byte, defaultFrameSize)); err != nil {
		t.Fatal(err)
	}
	_ = r.fr.WritePing(false, [8]byte{7})
	r.until("PING ack after a frame of the maximum size", func(f http2.Frame) bool {
		p, ok := f.(*http2.PingFrame)
		return ok && p.IsAck() && p.Data == [8]byte{7}
	})

	for _, tc := range []struct {
		name   string
		length uint32
		typ    http2.FrameType
		stream uint32
	}{
		{"unknown type, one byte over", defaultFrameSize + 1, 0xfe, 0},
		{"unknown type, 16 MiB", 1<<24 - 1, 0xfe, 0},
		{"DATA, 16 MiB", 1<<24 - 1, http2.FrameData, 1},
		{"HEADERS, 1 MiB", 1 << 20, http2.FrameHeaders, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRaw(t, ts.addr)
			writeFrameHeader(t, r.c, tc.length, tc.typ, tc.stream)
			_, _ = r.c.Write(make([]byte, 4096)) // some of the payload
			if code := readGoAway(t, r); code != http2.ErrCodeFrameSize {
				t.Errorf("GOAWAY %v, want FRAME_SIZE_ERROR", code)
			}
		})
	}
}

// 16 connections that each announce a 16 MiB unknown-type frame: the
// server must neither allocate the frame nor keep the connections. Before
// the bound, each connection allocated (and kept for its life) a 16 MiB read
// buffer: 256 MiB here.
func TestLargeFramesDoNotPinMemory(t *testing.T) {
	ts := serve(t, Options{}, map[string]Handler{"/t.S/Echo": echo})
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	before := heap()
	const conns = 16
	var wg sync.WaitGroup
	codes := make([]http2.ErrCode, conns)
	var mu sync.Mutex
	var peak uint64
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", ts.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.WriteString(c, clientPreface)
			fr := http2.NewFramer(c, c)
			_ = fr.WriteSettings()
			writeFrameHeader(t, c, 1<<24-1, 0xfe, 0)
			_, _ = c.Write(make([]byte, 64<<10))
			mu.Lock()
			peak = max(peak, heap())
			mu.Unlock()
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					if errors.Is(err, syscall.ECONNRESET) {
						t.Errorf("connection reset instead of GOAWAY and close")
					}
					return
				}
				if g, ok := f.(*http2.GoAwayFrame); ok {
					codes[i] = g.ErrCode
				}
			}
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != http2.ErrCodeFrameSize {
			t.Errorf("connection %d: GOAWAY %v, want FRAME_SIZE_ERROR", i, c)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for open := -1; open != 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ts.s.mu.Lock()
		open = len(ts.s.conns)
		ts.s.mu.Unlock()
	}
	after := heap()
	t.Logf("heap in use: %d KiB before, peak %d KiB, %d KiB after", before>>10, peak>>10, after>>10)
	// The control is the heap before the probes, measured in this run; 16
	// connections' fixed buffers are well under 8 MiB, one frame is 16 MiB.
	if peak > before+8<<20 || after > before+8<<20 {
		t.Errorf("heap grew from %d to peak %d, %d after: frames were buffered", before, peak, after)
	}
}
