package unarygrpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
)

// readLoopSettled reports whether each connection's read loop has read the
// stream last, or stopped reading: what is queued for the peer is over
// maxQueued (backpressure) or the connection is dead.
func readLoopSettled(s *Server, last uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.smu.Lock()
		read := c.lastStream >= last
		c.smu.Unlock()
		c.wmu.Lock()
		stopped := len(c.pending)+c.writing > maxQueued || c.dead
		c.wmu.Unlock()
		if !read && !stopped {
			return false
		}
	}
	return true
}

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
	// The read loop catches up with the kernel's receive buffer until it
	// has read every request sent or stops reading (what is queued is over
	// maxQueued, or the write deadline killed the connection); from then on
	// nothing more can be queued, so the last sample is the peak.
	last := 2*(i-1) + 1
	waitFor(t, "the server's read loop to read every request or stop reading", func() bool {
		peak = max(peak, maxPending(ts.s))
		return readLoopSettled(ts.s, last)
	})
	peak = max(peak, maxPending(ts.s))
	t.Logf("peak server pending buffer: %d bytes", peak)
	if peak > 4<<20 {
		t.Errorf("server queued %d MB of answers for a peer that does not read (no backpressure on the read loop)", peak>>20)
	}
}

// TestHeldRequestBytesBounded: the request bytes a connection's streams hold
// are bounded by MaxHeldBytes; a stream that would go over it is answered
// with ResourceExhausted (and its bytes dropped), not left to grow.
func TestHeldRequestBytesBounded(t *testing.T) {
	const maxHeld = 10 << 20
	ts := serve(t, Options{MaxHeldBytes: maxHeld}, map[string]Handler{"/t.S/Echo": echo})
	r := dialRaw(t, ts.addr)
	// Read the server's frames, keeping track of window and refusals.
	var mu sync.Mutex
	changed := sync.NewCond(&mu) // broadcast after each frame read, and when reading stops
	connWin, initWin := int64(65535), int64(65535)
	win := map[uint32]int64{}
	refused := map[uint32]bool{}
	var pinged, readerDone bool
	go func() {
		defer func() {
			mu.Lock()
			readerDone = true
			changed.Broadcast()
			mu.Unlock()
		}()
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				return
			}
			mu.Lock()
			changed.Broadcast()
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
			case *http2.MetaHeadersFrame:
				if headerValue(f, "grpc-status") == "8" {
					refused[f.StreamID] = true
				}
			case *http2.PingFrame:
				pinged = pinged || f.IsAck()
			}
			mu.Unlock()
		}
	}()
	const streams, per = 6, 4<<20 - 64
	chunk := make([]byte, 16384)
	sent := map[uint32]int{}
	for s := uint32(0); s < streams; s++ {
		id := 2*s + 1
		mu.Lock()
		win[id] = initWin
		mu.Unlock()
		r.headers(id, "/t.S/Echo", "application/grpc", false)
		binary.BigEndian.PutUint32(chunk[1:5], per)
		for left := per + 5; left > 0; {
			n := min(left, len(chunk))
			mu.Lock()
			// Wait for window, a refusal, or the end of reading (the
			// connection's 10 s deadline ends a server that never answers).
			for (connWin < int64(n) || win[id] < int64(n)) && !refused[id] && !readerDone {
				changed.Wait()
			}
			stop := refused[id] || connWin < int64(n) || win[id] < int64(n)
			if !stop {
				connWin -= int64(n)
				win[id] -= int64(n)
			}
			mu.Unlock()
			if stop {
				break // refused (or out of window: checked below)
			}
			if err := r.fr.WriteData(id, false, chunk[:n]); err != nil {
				t.Fatal(err)
			}
			chunk[0], chunk[1], chunk[2], chunk[3], chunk[4] = 0, 0, 0, 0, 0
			left -= n
			sent[id] += n
		}
	}
	// The server answers a stream's refusal as it reads the DATA that
	// overflows, before the ack of a PING sent after it: once the ack is
	// read every refusal is.
	if err := r.fr.WritePing(false, [8]byte{1}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for !pinged && !readerDone {
		changed.Wait()
	}
	if !pinged {
		t.Fatal("the connection ended before the PING ack")
	}
	var held int
	for id, n := range sent {
		if !refused[id] {
			held += n
		}
	}
	t.Logf("sent %v; refused %v; held by unrefused streams %d bytes", sent, refused, held)
	if len(refused) < 3 || held > maxHeld {
		t.Fatalf("%d streams refused, %d bytes held: want at least 3 refused and at most %d held", len(refused), held, maxHeld)
	}
}

// TestConcurrentLargeRequests: concurrent requests whose bodies together
// exceed the connection window all complete (a server that returned window
// only for complete requests would deadlock here).
func TestConcurrentLargeRequests(t *testing.T) {
	ts := serve(t, Options{}, map[string]Handler{"/t.S/Len": func(_ context.Context, req, dst []byte) ([]byte, error) {
		return binary.BigEndian.AppendUint32(dst, uint32(len(req))), nil
	}})
	cc := dial(t, ts.addr, grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ { // 8 x 3.9 MB = 31 MB on one connection, window 16 MiB
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := call(ctx, cc, "/t.S/Len", make([]byte, 3_900_000))
			if err != nil || len(out) != 4 || binary.BigEndian.Uint32(out) != 3_900_000 {
				t.Errorf("large request: %v %v", out, err)
			}
		}()
	}
	wg.Wait()
}
