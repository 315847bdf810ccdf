package unarygrpc

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

func maxPending(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := 0
	for c := range s.conns {
		c.wmu.Lock()
		m = max(m, len(c.pending))
		c.wmu.Unlock()
	}
	return m
}

// A client that sends requests but never reads: answers queue while the
// flusher sits in a blocked Write (up to writeTimeout); the read loop must
// stop reading past maxQueued, or the queue grows without bound.
func TestQueueBoundedWhenPeerDoesNotRead(t *testing.T) {
	ts := serve(t, Options{}, map[string]Handler{"/t.S/Echo": echo})
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	_ = c.SetDeadline(time.Now().Add(8 * time.Second))
	bw := bufio.NewWriterSize(c, 64<<10)
	io.WriteString(bw, clientPreface)
	fr := http2.NewFramer(bw, c)
	fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	peak := 0
	var i uint32
	defer func() { t.Logf("requests written: %d", i) }()
	for i = 0; i < 150000; i++ {
		hb.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/t.S/Nope"}, {":authority", "x"}, {"content-type", "application/grpc"}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2*i + 1, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
			t.Logf("write: %v", err)
			break
		}
		if i%2000 == 0 {
			bw.Flush()
			peak = max(peak, maxPending(ts.s))
		}
	}
	bw.Flush()
	for k := 0; k < 40; k++ { // the read loop catches up with the kernel's receive buffer
		time.Sleep(100 * time.Millisecond)
		peak = max(peak, maxPending(ts.s))
	}
	t.Logf("peak server pending buffer: %d bytes", peak)
	if peak > 4<<20 {
		t.Errorf("server queued %d MB of answers for a peer that does not read (no backpressure on the read loop)", peak>>20)
	}
}

// Connection window is returned when request bytes are released, not when
// they arrive, so requests held by the server (here: incomplete bodies) are
// bounded by the connection window, not by MaxConcurrentStreams x
// MaxRecvMsgSize.
func TestHeldRequestBytesBoundedByConnWindow(t *testing.T) {
	ts := serve(t, Options{}, map[string]Handler{"/t.S/Echo": echo})
	r := dialRaw(t, ts.addr)
	const streams = 6
	const per = 4<<20 - 64 // under MaxRecvMsgSize
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	connWin := int64(65535)
	win := map[uint32]int64{}
	initWin := int64(65535)
	go func() {
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				mu.Lock()
				connWin = -1 << 40
				cond.Broadcast()
				mu.Unlock()
				return
			}
			mu.Lock()
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
					for id := range win {
						win[id] += int64(v) - initWin
					}
					initWin = int64(v)
				}
			case *http2.WindowUpdateFrame:
				if f.StreamID == 0 {
					connWin += int64(f.Increment)
				} else {
					win[f.StreamID] += int64(f.Increment)
				}
			}
			cond.Broadcast()
			mu.Unlock()
		}
	}()
	var sent int64
	chunk := make([]byte, 16384)
	for s := uint32(0); s < streams; s++ {
		id := 2*s + 1
		mu.Lock()
		win[id] = initWin
		mu.Unlock()
		r.headers(id, "/t.S/Echo", "application/grpc", false)
		hdr := make([]byte, 5)
		binary.BigEndian.PutUint32(hdr[1:], per)
		copy(chunk, hdr)
		left := per + 5
		for left > 0 {
			n := min(left, len(chunk))
			mu.Lock()
			deadline := time.Now().Add(3 * time.Second)
			for (connWin < int64(n) || win[id] < int64(n)) && time.Now().Before(deadline) {
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
			}
			if connWin < int64(n) || win[id] < int64(n) {
				mu.Unlock()
				t.Logf("flow control stopped the client after %d bytes", sent)
				return
			}
			connWin -= int64(n)
			win[id] -= int64(n)
			mu.Unlock()
			if err := r.fr.WriteData(id, false, chunk[:n]); err != nil {
				t.Fatal(err)
			}
			copy(chunk, make([]byte, 5))
			left -= n
			sent += int64(n)
		}
	}
	t.Logf("sent %d MB of request bodies (no END_STREAM, nothing consumed) within flow control", sent>>20)
	if sent > connWindow {
		t.Errorf("server granted %d MB on one connection with no request consumed (conn window %d MB): receive flow control does not bound buffered memory", sent>>20, connWindow>>20)
	}
}
