package unarygrpc

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

const (
	errCodeNo        = http2.ErrCodeNo
	maxWindow        = 1<<31 - 1
	defaultFrameSize = 16384
)

// conn is one HTTP/2 connection. One goroutine (serve) reads frames; handlers
// answer from worker goroutines, writing under wmu.
type conn struct {
	s   *Server
	raw net.Conn // closed to stop everything, TLS or not
	fr  *http2.Framer

	// Writing. Frames are appended to pending under wmu; the flusher
	// goroutine writes what has accumulated in one write, so answers that
	// finish together (a store batch completes many calls at once) share a
	// syscall: one write per answer was a fifth of the CPU per call.
	wmu              sync.Mutex
	nc               net.Conn
	pending          []byte
	kick             chan struct{} // wakes the flusher (capacity 1)
	scheduled        bool          // a kick is pending
	closeWhenFlushed bool
	dead             bool      // a write failed or the connection closed: nothing more is written
	sendConn         int64     // the peer's connection window
	peerInit         int64     // the peer's SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame         int       // the peer's SETTINGS_MAX_FRAME_SIZE
	blocked          []*stream // answers waiting for window, in order

	// Streams.
	smu        sync.Mutex
	streams    map[uint32]*stream
	lastStream uint32
	// opened remembers which of the last openedWindow client stream ids
	// were opened (a bit per odd id): a HEADERS frame on an id at or below
	// lastStream is a closed stream reused (STREAM_CLOSED) or an id skipped
	// and now used out of order (PROTOCOL_ERROR), RFC 9113 5.1 and 5.1.1.
	opened    [openedWindow / 64]uint64
	goneAway  bool      // we sent GOAWAY: no new streams
	peerGone  bool      // the peer sent GOAWAY
	idleSince time.Time // when the last stream ended (or the connection started)
	closeOnce sync.Once
	closed    chan struct{}
	readDone  chan struct{} // the read loop returned
	flushDone chan struct{} // the flusher returned

	// Read side, serve's goroutine only.
	br          *bufio.Reader
	hb          *headerBlock // request header blocks, decoded
	ctlStart    time.Time
	ctlCount    int
	answersSeen uint64

	answers atomic.Uint64 // answers written; control frames after one are not abuse

	// Receive flow control. Connection window is returned as DATA arrives
	// (holding it until a request is complete deadlocks a connection whose
	// concurrent large requests together exceed the window); what the
	// server holds is bounded by held instead (Options.MaxHeldBytes).
	recvConn atomic.Int64 // what the peer may still send on the connection
	unacked  atomic.Int64 // received, not yet returned by WINDOW_UPDATE
	held     atomic.Int64 // request bytes held by this connection's streams
	// writing is the size of the write the flusher is making; with pending
	// it bounds what is queued for a peer that does not read (backpressure
	// on the read loop, see readLoop).
	writing int
	drained *sync.Cond // on wmu: the flusher wrote, or the connection died
	// windowed is broadcast (under wmu) when send window may have grown or a
	// stream was reset: streaming sends waiting for window look again.
	windowed *sync.Cond
	// tableSized: the first header block has set the peer's HPACK dynamic
	// table size to 0 (answers never use the table, so any
	// SETTINGS_HEADER_TABLE_SIZE the peer sends is respected).
	tableSized bool
}

// stream is one call. It is its handler's context.
type stream struct {
	c   *conn
	id  uint32
	h   Handler
	ah  AsyncHandler
	sh  ServerStreamHandler
	enc string // grpc-encoding
	// contentLength is the request's content-length, -1 when absent.
	contentLength int64
	gzipOut       bool    // the answer is gzip-compressed (set before finish)
	msgBuf        *[]byte // pooled holder of msg
	msg           []byte  // the request body as received (gRPC length-prefixed)
	req           []byte  // the message inside msg
	ended         bool    // END_STREAM received (read side only)
	held          int64   // DATA bytes (padding included) and decompressed bytes counted in c.held
	recvWin       int64   // read side only
	done          chan struct{}
	once          sync.Once
	holder        *[]byte // the answer's buffer, from run to Respond
	plain         *[]byte // the decompressed request, from run to Respond

	// Under c.wmu.
	reset       bool
	sendCredit  int64 // WINDOW_UPDATE increments for this stream
	sendUsed    int64
	headersSent bool
	out         []byte // DATA payload not yet sent
	trailers    []byte
}

var _ context.Context = (*stream)(nil)

func (st *stream) Deadline() (time.Time, bool) { return time.Time{}, false }
func (st *stream) Done() <-chan struct{}       { return st.done }
func (st *stream) Value(any) any               { return nil }
func (st *stream) Err() error {
	select {
	case <-st.done:
		return context.Canceled
	default:
		return nil
	}
}
func (st *stream) cancel() { st.once.Do(func() { close(st.done) }) }

func (s *Server) newConn(nc net.Conn) *conn {
	c := &conn{
		s:         s,
		raw:       nc,
		kick:      make(chan struct{}, 1),
		closed:    make(chan struct{}),
		readDone:  make(chan struct{}),
		flushDone: make(chan struct{}),
		streams:   map[uint32]*stream{},
		sendConn:  65535,
		peerInit:  65535,
		maxFrame:  defaultFrameSize,
	}
	c.recvConn.Store(connWindow)
	c.drained = sync.NewCond(&c.wmu)
	c.windowed = sync.NewCond(&c.wmu)
	return c
}

// maxQueued bounds the answers and control frames queued for one peer
// before the read loop stops reading from it.
const maxQueued = 1 << 20

// releaseConn returns n bytes of connection window, in WINDOW_UPDATEs of at
// least a quarter window.
func (c *conn) releaseConn(n int64) {
	if n <= 0 {
		return
	}
	if c.unacked.Add(n) < connWindow/4 {
		return
	}
	if inc := c.unacked.Swap(0); inc > 0 {
		c.recvConn.Add(inc)
		c.write(func() error { return c.fr.WriteWindowUpdate(0, uint32(inc)) })
	}
}

func (c *conn) serve() {
	defer c.s.removeConn(c)
	// Whatever ends the read loop, frames already queued (a GOAWAY, answers)
	// are written before the connection closes.
	defer c.closeAfterFlush()
	nc, br, err := c.s.handshake(c.raw)
	if err != nil {
		c.s.log.Debug("grpc: connection refused", "remote", c.raw.RemoteAddr().String(), "err", err)
		c.close()
		return
	}
	c.wmu.Lock()
	c.nc = nc
	c.br = br
	c.fr = http2.NewFramer((*pendingWriter)(c), br)
	c.hb = newHeaderBlock(c.s.o.MaxHeaderListSize)
	// The server never advertises SETTINGS_MAX_FRAME_SIZE, so the peer may
	// send at most the default 16,384 bytes per frame (RFC 9113 4.2). The
	// framer's own default is 16 MiB, and its read buffer grows to the
	// largest frame read and stays that large: a peer could pin 16 MiB per
	// connection with one unknown-type frame. A larger frame is a
	// FRAME_SIZE_ERROR connection error (readLoop), as in grpc-go.
	c.fr.SetMaxReadFrameSize(defaultFrameSize)
	c.fr.SetReuseFrames()
	c.wmu.Unlock()
	go c.flusher()
	// Run before removeConn, after closeAfterFlush: the connection is not
	// done (nor GracefulStop finished) until the flusher has written
	// everything and closed.
	defer func() { <-c.flushDone }()
	defer c.closeAfterFlush()
	c.write(func() error {
		if err := c.fr.WriteSettings(
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.s.o.MaxConcurrentStreams},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: c.s.o.MaxHeaderListSize},
		); err != nil {
			return err
		}
		return c.fr.WriteWindowUpdate(0, connWindow-65535)
	})
	if age := c.s.o.MaxConnectionAge; age > 0 {
		// ±10% jitter, as grpc-go, so connections made together do not
		// all go away together.
		age += time.Duration((rand.Float64()*0.2 - 0.1) * float64(age))
		t1 := time.AfterFunc(age, func() { c.goAway(errCodeNo) })
		defer t1.Stop()
		if grace := c.s.o.MaxConnectionAgeGrace; grace > 0 {
			t2 := time.AfterFunc(age+grace, c.close)
			defer t2.Stop()
		}
	}
	if idle := c.s.o.IdleTimeout; idle > 0 {
		c.smu.Lock()
		c.idleSince = time.Now()
		c.smu.Unlock()
		var t *time.Timer
		t = time.AfterFunc(time.Hour, func() {
			if next := c.checkIdle(idle); next > 0 {
				t.Reset(next)
			}
		})
		t.Reset(idle) // after t is set: the callback reads it
		defer t.Stop()
	}
	// readLoop returns only when the connection ends, always with the
	// cause (io.EOF when the peer hung up), never nil: log it every time.
	err = c.readLoop()
	close(c.readDone)
	c.s.log.Debug("grpc: connection closed", "remote", c.raw.RemoteAddr().String(), "err", err)
}

// pendingWriter is the framer's writer: frames go to pending (under wmu).
type pendingWriter conn

func (w *pendingWriter) Write(p []byte) (int, error) {
	w.pending = append(w.pending, p...)
	return len(p), nil
}

// flusher writes pending frames, as many as have accumulated, until the
// connection closes.
func (c *conn) flusher() {
	defer close(c.flushDone)
	var spare []byte
	for {
		select {
		case <-c.kick:
		case <-c.closed:
			return
		}
		c.wmu.Lock()
		small := len(c.pending) < 4096 && !c.closeWhenFlushed
		c.wmu.Unlock()
		if small {
			// Let the other answers that are ready be appended first (as
			// grpc-go's loopy writer does): fewer, larger writes.
			runtime.Gosched()
		}
		c.wmu.Lock()
		buf := c.pending
		c.pending, c.scheduled = spare[:0], false
		c.writing = len(buf)
		closeNow := c.closeWhenFlushed
		dead := c.dead
		c.wmu.Unlock()
		if len(buf) > 0 && !dead {
			_ = c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
			_, err := c.nc.Write(buf)
			c.wmu.Lock()
			c.writing = 0
			if err != nil {
				c.failLocked(err)
			}
			c.drained.Broadcast()
			c.wmu.Unlock()
			if err != nil {
				return
			}
		}
		if cap(buf) <= 64<<10 {
			spare = buf[:0]
		} else {
			spare = nil // let a burst's large buffer go
		}
		if closeNow {
			c.lingerClose()
			return
		}
	}
}

// close tears the connection down: handlers still running are canceled and
// their answers dropped.
func (c *conn) close() {
	c.closeOnce.Do(func() {
		close(c.closed)
		_ = c.raw.Close() // tearing the connection down; readLoop reports the cause
		c.wmu.Lock()
		c.dead = true
		c.drained.Broadcast()
		c.windowed.Broadcast()
		c.wmu.Unlock()
		c.smu.Lock()
		for _, st := range c.streams {
			st.cancel()
		}
		c.smu.Unlock()
	})
}

// lingerTimeout bounds how long a closing connection keeps reading (and
// discarding) what the peer still sends after the server's last frame.
const lingerTimeout = time.Second

// lingerClose closes a connection whose last frames (answers, GOAWAY) are
// written. Closing a socket that has unread input makes the kernel send a
// TCP reset, which can destroy those frames before the peer reads them; so
// the write side is shut first, and what the peer still sends is read and
// discarded until it closes too or lingerTimeout passes (as net/http's
// closeWriteAndWait and grpc-go's server do).
func (c *conn) lingerClose() {
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite() // TLS: close_notify; TCP: FIN
	}
	if tc, ok := c.raw.(*net.TCPConn); ok && c.nc != c.raw {
		_ = tc.CloseWrite()
	}
	_ = c.raw.SetReadDeadline(time.Now().Add(lingerTimeout))
	t := time.NewTimer(lingerTimeout)
	defer t.Stop()
	select {
	case <-c.readDone:
		// Nobody reads any more: discard here, in a small buffer.
		var buf [512]byte
		for {
			if _, err := c.raw.Read(buf[:]); err != nil {
				break
			}
		}
	case <-t.C:
	case <-c.closed:
	}
	c.close()
}

// closeAfterFlush closes the connection once the frames queued so far are
// written.
func (c *conn) closeAfterFlush() {
	c.wmu.Lock()
	c.closeWhenFlushed = true
	ready := c.fr != nil && !c.dead
	c.kickLocked()
	c.wmu.Unlock()
	if !ready {
		c.close()
	}
}

// write runs f (frame writes) under wmu and wakes the flusher.
func (c *conn) write(f func() error) {
	c.wmu.Lock()
	if !c.dead {
		if err := f(); err != nil {
			c.failLocked(err)
		}
		if len(c.pending) > 0 {
			c.kickLocked()
		}
	}
	c.wmu.Unlock()
}

func (c *conn) kickLocked() {
	if !c.scheduled {
		c.scheduled = true
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

func (c *conn) failLocked(err error) {
	if !c.dead {
		c.dead = true
		c.windowed.Broadcast()
		c.s.log.Debug("grpc: write failed", "err", err)
		go c.close()
	}
}

// idle reports whether a client stream id was never used (above the last).
func (c *conn) idle(id uint32) bool {
	c.smu.Lock()
	defer c.smu.Unlock()
	return id > c.lastStream
}

func (c *conn) lookup(id uint32) *stream {
	c.smu.Lock()
	st := c.streams[id]
	c.smu.Unlock()
	return st
}

// removeStream frees a stream's slot; a connection going away closes when
// its last stream is done.
func (c *conn) removeStream(st *stream) {
	c.smu.Lock()
	delete(c.streams, st.id)
	if len(c.streams) == 0 {
		c.idleSince = time.Now()
	}
	last := len(c.streams) == 0 && (c.goneAway || c.peerGone)
	c.smu.Unlock()
	if last {
		c.closeAfterFlush()
	}
}

// checkIdle sends GOAWAY (and so closes) a connection without a stream
// for idle; otherwise it returns when to look again.
func (c *conn) checkIdle(idle time.Duration) time.Duration {
	c.smu.Lock()
	busy, since, gone := len(c.streams) > 0, c.idleSince, c.goneAway
	c.smu.Unlock()
	switch {
	case gone:
		return 0
	case busy:
		return idle
	}
	if left := idle - time.Since(since); left > 0 {
		return left
	}
	c.s.idleClosed.Add(1)
	c.goAway(errCodeNo)
	return 0
}

// openedWindow is how many recent client stream ids opened remembers.
const openedWindow = 4096

// openLocked makes id (odd, above lastStream) the last stream opened.
func (c *conn) openLocked(id uint32) {
	if id-c.lastStream >= 2*openedWindow {
		clear(c.opened[:])
	} else {
		for skipped := c.lastStream + 2; skipped < id; skipped += 2 {
			i := (skipped / 2) % openedWindow
			c.opened[i/64] &^= 1 << (i % 64)
		}
	}
	i := (id / 2) % openedWindow
	c.opened[i/64] |= 1 << (i % 64)
	c.lastStream = id
}

// wasOpenedLocked reports whether id, at or below lastStream, was opened;
// ids older than the window count as opened (closed long ago).
func (c *conn) wasOpenedLocked(id uint32) bool {
	if c.lastStream-id >= 2*openedWindow {
		return true
	}
	i := (id / 2) % openedWindow
	return c.opened[i/64]&(1<<(i%64)) != 0
}

// goAway sends GOAWAY: streams up to the last one seen are answered, later
// ones were not processed and the client may retry them elsewhere.
func (c *conn) goAway(code http2.ErrCode) {
	c.smu.Lock()
	if c.goneAway {
		c.smu.Unlock()
		return
	}
	c.goneAway = true
	last, idle := c.lastStream, len(c.streams) == 0
	c.wmu.Lock()
	ready := c.fr != nil
	c.wmu.Unlock()
	if !ready {
		c.smu.Unlock()
		c.close() // still in the handshake
		return
	}
	// Queued while smu is held, so the last stream's removal (which may
	// close the connection after a flush) cannot come first. smu is never
	// taken under wmu, so this order is safe.
	c.write(func() error { return c.fr.WriteGoAway(last, code, nil) })
	c.smu.Unlock()
	if idle || code != errCodeNo {
		c.closeAfterFlush()
	}
}

func (c *conn) rst(id uint32, code http2.ErrCode) {
	c.write(func() error { return c.fr.WriteRSTStream(id, code) })
}

// errConn is a connection error: GOAWAY with the code, then close.
type errConn struct {
	code http2.ErrCode
	why  string
}

func (e errConn) Error() string { return fmt.Sprintf("http2 %v: %s", e.code, e.why) }

func (c *conn) readLoop() error {
	for {
		c.wmu.Lock()
		for len(c.pending)+c.writing > maxQueued && !c.dead {
			// The peer is not reading what it asked for: stop reading
			// from it until the flusher gets through (or the write
			// deadline kills the connection).
			c.drained.Wait()
		}
		c.wmu.Unlock()
		if c.br.Buffered() == 0 {
			// Before blocking in read: let the calls just dispatched run
			// first, so more requests arrive per read.
			runtime.Gosched()
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.streamError(se.StreamID, se.Code)
				continue
			}
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				c.goAway(http2.ErrCode(ce))
				return err
			}
			if errors.Is(err, http2.ErrFrameTooLarge) {
				c.goAway(http2.ErrCodeFrameSize)
			}
			return err
		}
		if err := c.handle(f); err != nil {
			var ec errConn
			if errors.As(err, &ec) {
				c.goAway(ec.code)
			}
			return err
		}
	}
}

// streamError answers a stream error: the stream (opened first if the
// error came with its first frame) is reset.
func (c *conn) streamError(id uint32, code http2.ErrCode) {
	c.smu.Lock()
	if id > c.lastStream && id%2 == 1 {
		c.openLocked(id)
	}
	st := c.streams[id]
	c.smu.Unlock()
	if st != nil {
		c.resetStream(st)
	}
	c.rst(id, code)
}

func (c *conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.HeadersFrame:
		c.hb.start(f)
		return c.onBlock(c.hb.add(f.HeaderBlockFragment(), f.HeadersEnded()))
	case *http2.ContinuationFrame:
		// The framer lets a CONTINUATION through only after a HEADERS
		// frame header of its stream that did not end the block; add
		// ignores one whose HEADERS frame the framer then refused.
		return c.onBlock(c.hb.add(f.HeaderBlockFragment(), f.HeadersEnded()))
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if err := c.control(); err != nil {
			return err
		}
		return c.onSettings(f)
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		if err := c.control(); err != nil {
			return err
		}
		data := f.Data
		c.write(func() error { return c.fr.WritePing(true, data) })
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		if st := c.lookup(f.StreamID); st != nil {
			c.resetStream(st)
		} else if c.idle(f.StreamID) {
			return errConn{http2.ErrCodeProtocol, fmt.Sprintf("RST_STREAM on idle stream %d", f.StreamID)}
		}
	case *http2.GoAwayFrame:
		c.smu.Lock()
		c.peerGone = true
		idle := len(c.streams) == 0
		c.smu.Unlock()
		if idle {
			return errors.New("peer sent GOAWAY")
		}
	case *http2.PushPromiseFrame:
		return errConn{http2.ErrCodeProtocol, "PUSH_PROMISE from a client"}
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			// A stream cannot depend on itself (RFC 9113 5.3.1): a stream error.
			if st := c.lookup(f.StreamID); st != nil {
				c.resetStream(st)
			}
			c.rst(f.StreamID, http2.ErrCodeProtocol)
		}
	}
	// PRIORITY and unknown frame types are ignored, as RFC 9113 asks.
	return nil
}

// control rate-limits frames that make the server write (PING, SETTINGS).
// As in grpc-go's server, a PING that follows an answer is not counted:
// grpc-go clients probe bandwidth with a PING per burst of data received.
func (c *conn) control() error {
	now := time.Now()
	if n := c.answers.Load(); n != c.answersSeen {
		c.answersSeen = n
		c.ctlStart, c.ctlCount = now, 0
	}
	if now.Sub(c.ctlStart) > time.Second {
		c.ctlStart, c.ctlCount = now, 0
	}
	c.ctlCount++
	if c.ctlCount > c.s.o.ControlFramesPerSecond {
		return errConn{http2.ErrCodeEnhanceYourCalm, "too many PING/SETTINGS frames"}
	}
	return nil
}

func (c *conn) onSettings(f *http2.SettingsFrame) error {
	var bad error
	c.wmu.Lock()
	_ = f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			bad = err
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			c.peerInit = int64(s.Val)
		case http2.SettingMaxFrameSize:
			c.maxFrame = int(s.Val)
		}
		return nil
	})
	c.wmu.Unlock()
	if bad != nil {
		var ce http2.ConnectionError
		if errors.As(bad, &ce) {
			return errConn{http2.ErrCode(ce), bad.Error()} // FLOW_CONTROL_ERROR for a window over 2^31-1
		}
		return errConn{http2.ErrCodeProtocol, bad.Error()}
	}
	c.write(func() error {
		if err := c.fr.WriteSettingsAck(); err != nil {
			return err
		}
		c.windowed.Broadcast()
		return c.pushBlockedLocked() // a larger window may free answers
	})
	return nil
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	var st *stream
	if f.StreamID != 0 {
		if st = c.lookup(f.StreamID); st == nil {
			c.smu.Lock()
			idle := f.StreamID > c.lastStream
			c.smu.Unlock()
			if idle {
				return errConn{http2.ErrCodeProtocol, fmt.Sprintf("WINDOW_UPDATE on idle stream %d", f.StreamID)}
			}
			return nil // a stream already answered
		}
	}
	var overflow, streamOverflow bool
	c.write(func() error {
		if st == nil {
			c.sendConn += int64(f.Increment)
			overflow = c.sendConn > maxWindow
		} else {
			st.sendCredit += int64(f.Increment)
			streamOverflow = c.peerInit+st.sendCredit-st.sendUsed > maxWindow
		}
		c.windowed.Broadcast()
		return c.pushBlockedLocked()
	})
	if overflow {
		return errConn{http2.ErrCodeFlowControl, "connection window above 2^31-1"}
	}
	if streamOverflow {
		c.resetStream(st)
		c.rst(st.id, http2.ErrCodeFlowControl)
	}
	return nil
}

// onBlock acts on a header block's progress: nothing until it ends, then
// its request, or its refusal (a stream or a connection error).
func (c *conn) onBlock(h *requestHeaders, berr *blockError) error {
	if berr != nil {
		if berr.stream {
			c.s.log.Debug("grpc: header block refused", "stream", c.hb.h.StreamID, "err", berr.err)
			c.streamError(c.hb.h.StreamID, berr.code)
			return nil
		}
		return errConn{berr.code, berr.Error()}
	}
	if h == nil {
		return nil
	}
	return c.onHeaders(h)
}

func (c *conn) onHeaders(f *requestHeaders) error {
	st, err := c.openStream(f)
	if st == nil {
		return err
	}
	if !c.admit(st, f) {
		return nil
	}
	if f.StreamEnded() {
		if st.contentLength > 0 {
			c.resetStream(st)
			c.rst(st.id, http2.ErrCodeProtocol)
			return nil
		}
		c.endRequest(st)
	}
	return nil
}

// openStream opens the stream a HEADERS frame starts. It returns nil when
// the frame needs nothing more: trailers of an open stream (which end its
// request), a stream error already answered, a refused stream, or a
// connection error (returned).
func (c *conn) openStream(f *requestHeaders) (*stream, error) {
	id := f.StreamID
	c.smu.Lock()
	if st := c.streams[id]; st != nil {
		c.smu.Unlock()
		return nil, c.onTrailers(st, f)
	}
	if id%2 == 0 {
		c.smu.Unlock()
		return nil, errConn{http2.ErrCodeProtocol, fmt.Sprintf("HEADERS on server stream id %d", id)}
	}
	if id <= c.lastStream {
		opened := c.wasOpenedLocked(id)
		c.smu.Unlock()
		if opened {
			// Closed: the client ended it (or reset it, or we answered).
			// gRPC clients send no trailers, so no HEADERS can be in flight.
			return nil, errConn{http2.ErrCodeStreamClosed, fmt.Sprintf("HEADERS on closed stream %d", id)}
		}
		return nil, errConn{http2.ErrCodeProtocol, fmt.Sprintf("stream id %d after %d: stream ids must increase", id, c.lastStream)}
	}
	c.openLocked(id)
	if c.goneAway || c.peerGone || uint32(len(c.streams)) >= c.s.o.MaxConcurrentStreams {
		c.smu.Unlock()
		c.rst(id, http2.ErrCodeRefusedStream)
		return nil, nil
	}
	st := &stream{c: c, id: id, done: make(chan struct{}), recvWin: streamWindow, contentLength: -1}
	c.streams[id] = st
	c.smu.Unlock()
	return st, nil
}

// onTrailers handles a HEADERS frame on an open stream.
func (c *conn) onTrailers(st *stream, f *requestHeaders) error {
	if st.ended {
		// Half-closed (remote): nothing but WINDOW_UPDATE, PRIORITY and
		// RST_STREAM may come (RFC 9113 5.1): a stream error.
		c.resetStream(st)
		c.rst(st.id, http2.ErrCodeStreamClosed)
		return nil
	}
	// Trailers from the client (gRPC clients send none): they must end
	// the request.
	if !f.StreamEnded() {
		return errConn{http2.ErrCodeProtocol, "HEADERS after the request headers without END_STREAM"}
	}
	c.endRequest(st)
	return nil
}

// admit checks a new stream's request headers and binds its method; false
// when the stream was answered or reset instead.
func (c *conn) admit(st *stream, f *requestHeaders) bool {
	id := st.id
	if f.Truncated {
		c.answerEarly(st, f.StreamEnded(), 200, codes.Internal, "request headers exceed the header list size limit")
		return false
	}
	if f.HasPriority() && f.Priority.StreamDep == id {
		c.resetStream(st)
		c.rst(id, http2.ErrCodeProtocol)
		return false
	}
	if why := malformedRequest(f); why != "" {
		// A malformed request is a stream error (RFC 9113 8.1.1).
		c.s.log.Debug("grpc: malformed request", "stream", id, "why", why)
		c.resetStream(st)
		c.rst(id, http2.ErrCodeProtocol)
		return false
	}
	ct, timeout, ok := c.readFields(st, f)
	if !ok {
		return false
	}
	if m := f.PseudoValue("method"); m != "POST" {
		// grpc-go's answer: HTTP 405 (a GET or HEAD is a valid HTTP/2
		// request, just not a gRPC one).
		c.answerEarly(st, f.StreamEnded(), 405, codes.Internal, fmt.Sprintf("Received a HEADERS frame with :method %q which should be POST", m))
		return false
	}
	if !isGRPCContentType(ct) {
		c.answerEarly(st, f.StreamEnded(), 415, codes.Internal, "invalid gRPC request content-type "+quote(ct))
		return false
	}
	if timeout != "" {
		if _, err := parseTimeout(timeout); err != nil {
			// HTTP 400, as grpc-go answers a malformed grpc-timeout.
			c.answerEarly(st, f.StreamEnded(), 400, codes.Internal, "malformed grpc-timeout: "+err.Error())
			return false
		}
	}
	path := f.PseudoValue("path")
	st.h, st.ah, st.sh = c.s.methods[path], c.s.async[path], c.s.streams[path]
	if st.h == nil && st.ah == nil && st.sh == nil {
		c.answerEarly(st, f.StreamEnded(), 200, codes.Unimplemented, c.s.unknown(path))
		return false
	}
	return true
}

// readFields reads the regular header fields the server needs into st
// (grpc-encoding, content-length) and returns content-type and
// grpc-timeout; false when a malformed content-length reset the stream.
func (c *conn) readFields(st *stream, f *requestHeaders) (ct, timeout string, ok bool) {
	for _, hf := range f.RegularFields() {
		switch hf.Name {
		case "content-type":
			ct = hf.Value
		case "grpc-encoding":
			st.enc = hf.Value
		case "grpc-timeout":
			timeout = hf.Value
		case "content-length":
			// gRPC clients send none; one that is sent must match the body
			// (RFC 9113 8.1.1), checked as DATA arrives and at its end.
			n, err := strconv.ParseInt(hf.Value, 10, 64)
			if err != nil || n < 0 {
				c.resetStream(st)
				c.rst(st.id, http2.ErrCodeProtocol)
				return "", "", false
			}
			st.contentLength = n
		}
	}
	return ct, timeout, true
}

// malformedRequest says why a request's header block is malformed (RFC 9113
// 8.2.2 and 8.3.1), or "" when it is not: connection-specific fields, a TE
// other than "trailers", a missing or empty :method, :scheme or :path (no
// CONNECT here), or a response pseudo-header. The framer has already
// refused invalid names and values, duplicate and misplaced pseudo-headers.
func malformedRequest(f *requestHeaders) string {
	var method, scheme, path bool
	for _, hf := range f.PseudoFields() {
		switch hf.Name {
		case ":method":
			method = hf.Value != ""
		case ":scheme":
			scheme = hf.Value != ""
		case ":path":
			path = hf.Value != ""
		case ":authority":
		default:
			return "pseudo-header " + hf.Name + " in a request"
		}
	}
	if !method || !scheme || !path {
		return "missing or empty :method, :scheme or :path"
	}
	for _, hf := range f.RegularFields() {
		switch hf.Name {
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
			return "connection-specific header " + hf.Name
		case "te":
			if hf.Value != "trailers" {
				return "te other than trailers"
			}
		}
	}
	return ""
}

// unknown words an unknown method as grpc-go does.
func (s *Server) unknown(path string) string {
	svc, method, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if !ok {
		return "malformed method name: " + quote(path)
	}
	for p := range s.methods {
		if strings.HasPrefix(p, "/"+svc+"/") {
			return fmt.Sprintf("unknown method %s for service %s", method, svc)
		}
	}
	for p := range s.async {
		if strings.HasPrefix(p, "/"+svc+"/") {
			return fmt.Sprintf("unknown method %s for service %s", method, svc)
		}
	}
	for p := range s.streams {
		if strings.HasPrefix(p, "/"+svc+"/") {
			return fmt.Sprintf("unknown method %s for service %s", method, svc)
		}
	}
	return "unknown service " + svc
}

func isGRPCContentType(ct string) bool {
	if !strings.HasPrefix(ct, "application/grpc") {
		return false
	}
	rest := ct[len("application/grpc"):]
	return rest == "" || rest[0] == '+' || rest[0] == ';'
}

func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return fmt.Sprintf("%q", s)
}

func (c *conn) onData(f *http2.DataFrame) error {
	n := int64(f.Length)
	if c.recvConn.Add(-n) < 0 {
		return errConn{http2.ErrCodeFlowControl, "DATA beyond the connection window"}
	}
	c.releaseConn(n)
	id := f.StreamID
	st := c.lookup(id)
	if st == nil {
		c.smu.Lock()
		idle := id > c.lastStream
		c.smu.Unlock()
		if idle {
			return errConn{http2.ErrCodeProtocol, fmt.Sprintf("DATA on idle stream %d", id)}
		}
		// Closed: a stream error (RFC 9113 6.1). If we reset it first, the
		// client may have had DATA in flight; the RST_STREAM it gets here
		// is harmless, and its window was returned above.
		c.rst(id, http2.ErrCodeStreamClosed)
		return nil
	}
	if st.ended {
		// DATA after END_STREAM (or after an early answer): the stream is
		// closed for good, so its answer must not be sent after this
		// RST_STREAM either.
		c.resetStream(st)
		c.rst(id, http2.ErrCodeStreamClosed)
		return nil
	}
	if c.held.Load()+n > c.s.o.MaxHeldBytes {
		c.answerEarly(st, f.StreamEnded(), 200, codes.ResourceExhausted,
			fmt.Sprintf("the connection's requests in progress exceed %d bytes", c.s.o.MaxHeldBytes))
		return nil
	}
	st.held += n
	c.held.Add(n)
	if st.recvWin -= n; st.recvWin < 0 {
		c.resetStream(st)
		c.rst(id, http2.ErrCodeFlowControl)
		return nil
	}
	data := f.Data()
	if len(st.msg) < 5 && len(st.msg)+len(data) >= 5 {
		// The length prefix is complete: refuse an oversized message
		// before buffering it.
		var hdr [5]byte
		k := copy(hdr[:], st.msg)
		copy(hdr[k:], data)
		if size := binary.BigEndian.Uint32(hdr[1:]); int64(size) > int64(c.s.o.MaxRecvMsgSize) {
			c.answerEarly(st, f.StreamEnded(), 200, codes.ResourceExhausted,
				fmt.Sprintf("grpc: received message larger than max (%d vs. %d)", size, c.s.o.MaxRecvMsgSize))
			return nil
		}
	}
	if len(st.msg)+len(data) > c.s.o.MaxRecvMsgSize+5 {
		c.answerEarly(st, f.StreamEnded(), 200, codes.ResourceExhausted,
			fmt.Sprintf("grpc: received message larger than max (%d vs. %d)", len(st.msg)+len(data)-5, c.s.o.MaxRecvMsgSize))
		return nil
	}
	if cl := st.contentLength; cl >= 0 && (int64(len(st.msg)+len(data)) > cl || f.StreamEnded() && int64(len(st.msg)+len(data)) != cl) {
		c.resetStream(st)
		c.rst(id, http2.ErrCodeProtocol)
		return nil
	}
	if st.msgBuf == nil {
		st.msgBuf = getBuf()
		st.msg = (*st.msgBuf)[:0]
	}
	st.msg = append(st.msg, data...)
	if f.StreamEnded() {
		c.endRequest(st)
		return nil
	}
	if st.recvWin < streamWindow/2 {
		inc := streamWindow - st.recvWin
		st.recvWin = streamWindow
		c.write(func() error { return c.fr.WriteWindowUpdate(id, uint32(inc)) })
	}
	return nil
}

// endRequest checks the request message and hands the call to a handler.
func (c *conn) endRequest(st *stream) {
	st.ended = true
	if len(st.msg) < 5 {
		c.answerEarly(st, true, 200, codes.Internal, "grpc: request has no message")
		return
	}
	if st.msg[0]&1 == 1 && st.enc != gzipEncoding {
		// grpc-go's words; the answer's grpc-accept-encoding says what is.
		c.answerEarly(st, true, 200, codes.Unimplemented, fmt.Sprintf("grpc: Decompressor is not installed for grpc-encoding %q", st.enc))
		return
	}
	if size := binary.BigEndian.Uint32(st.msg[1:5]); int64(size) != int64(len(st.msg)-5) {
		c.answerEarly(st, true, 200, codes.Internal, fmt.Sprintf("grpc: malformed request: message of %d bytes, %d received", size, len(st.msg)-5))
		return
	}
	st.req = st.msg[5:]
	if st.ah != nil && st.msg[0]&1 == 0 {
		// An asynchronous handler only starts the call: run it here, with
		// no hand-off to a worker (a compressed request is inflated on a
		// worker first).
		c.run(st)
		return
	}
	c.s.dispatch(st)
}

// run calls the handler, which answers through Respond (an asynchronous
// handler's when it is ready).
func (c *conn) run(st *stream) {
	if st.sh != nil {
		c.runStream(st)
		return
	}
	st.holder = getBuf()
	req, err := st.req, error(nil)
	if st.msg[0]&1 == 1 {
		st.plain = getBuf()
		req, err = gunzipHeld((*st.plain)[:0], st.req, c.s.o.MaxRecvMsgSize, st.hold)
		*st.plain = req
		switch {
		case errors.Is(err, errHoldRefused):
			err = statusError{codes.ResourceExhausted, fmt.Sprintf("the connection's requests in progress exceed %d bytes", c.s.o.MaxHeldBytes)}
		case errors.Is(err, errDecompressedTooLarge):
			err = statusError{codes.ResourceExhausted, fmt.Sprintf("grpc: received message after decompression larger than max (%d)", c.s.o.MaxRecvMsgSize)}
		case err != nil:
			err = statusError{codes.Internal, "grpc: failed to decompress the received message: " + err.Error()}
		}
	}
	switch {
	case err != nil:
		st.Respond(nil, err)
	case st.ah != nil:
		st.ah(st, req, st)
	default:
		out, err := st.h(st, req, st.Buffer())
		st.Respond(out, err)
	}
}

// Buffer is the answer's buffer, its gRPC message prefix reserved (Reply).
func (st *stream) Buffer() []byte { return append((*st.holder)[:0], 0, 0, 0, 0, 0) }

// Respond writes the call's answer (Reply): headers, out's message and the
// trailers, or err's trailers; then it frees what the call held.
func (st *stream) Respond(out []byte, err error) {
	c, holder := st.c, st.holder
	if err == nil && len(out) < 5 {
		err = errors.New("unarygrpc: handler did not append to dst")
	}
	if err == nil && st.enc == gzipEncoding {
		// As grpc-go: a client that sent grpc-encoding gzip gets its
		// answer in gzip too.
		var z []byte
		if z, err = appendGzip(append(make([]byte, 0, 64+len(out)/2), 0, 0, 0, 0, 0), out[5:]); err == nil {
			*holder = out
			out = z
			out[0] = 1
			st.gzipOut = true
		}
	}
	if err != nil {
		c.finish(st, nil, statusTrailers(nil, 200, err))
	} else {
		if !st.gzipOut {
			out[0] = 0
			*holder = out // keep the grown buffer
		}
		binary.BigEndian.PutUint32(out[1:5], uint32(len(out)-5))
		c.finish(st, out, okTrailers)
	}
	st.releaseMsg()
	putBuf(holder)
	if st.plain != nil {
		putBuf(st.plain)
	}
	st.holder, st.plain = nil, nil
}

// hold counts n more bytes of the stream's request (its decompression,
// growing) in the connection's held bytes; false, counting nothing, when
// that would pass MaxHeldBytes. A compressed request's DATA alone does not
// bound what its handler holds: 1 KB of gzip inflates to 1 MiB.
func (st *stream) hold(n int) bool {
	c := st.c
	if c.held.Add(int64(n)) > c.s.o.MaxHeldBytes {
		c.held.Add(-int64(n))
		return false
	}
	st.held += int64(n)
	return true
}

func (st *stream) releaseMsg() {
	if st.msgBuf != nil {
		*st.msgBuf = st.msg
		putBuf(st.msgBuf)
	}
	st.msgBuf, st.msg, st.req = nil, nil, nil
	st.c.held.Add(-st.held)
	st.held = 0
}

// answerEarly answers before (or instead of) calling a handler: a
// trailers-only response, then RST_STREAM NO_ERROR if the client is still
// sending, so it stops.
func (c *conn) answerEarly(st *stream, clientDone bool, httpStatus int, code codes.Code, msg string) {
	st.ended = true
	block := statusTrailers(nil, httpStatus, statusError{code, msg})
	c.write(func() error {
		if st.reset {
			return nil
		}
		if err := c.writeBlockLocked(st.id, block, true); err != nil {
			return err
		}
		if !clientDone {
			return c.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
		}
		return nil
	})
	st.releaseMsg()
	c.removeStream(st)
}

// finish writes an answer: headers, the message (out, nil for a
// trailers-only error answer) and the trailers block.
func (c *conn) finish(st *stream, out, trailers []byte) {
	done := true
	c.write(func() error {
		if st.reset {
			return nil
		}
		if out == nil {
			return c.writeBlockLocked(st.id, trailers, true)
		}
		st.out, st.trailers = out, trailers
		var err error
		done, err = c.pushLocked(st)
		if !done {
			// Wait for WINDOW_UPDATE with a copy: out goes back to the pool.
			st.out = append([]byte(nil), st.out...)
			c.blocked = append(c.blocked, st)
		}
		return err
	})
	if done {
		c.removeStream(st)
	}
}

// pushLocked writes as much of st's answer as the windows allow; done
// reports that all of it, trailers included, is written.
func (c *conn) pushLocked(st *stream) (done bool, err error) {
	if !st.headersSent {
		st.headersSent = true
		c.answers.Add(1)
		hdr := okHeaders
		if st.gzipOut {
			hdr = gzipHeaders
		}
		if err := c.writeBlockLocked(st.id, hdr, false); err != nil {
			return true, err
		}
	}
	for len(st.out) > 0 {
		n := int64(len(st.out))
		n = min(n, c.sendConn, c.peerInit+st.sendCredit-st.sendUsed, int64(c.maxFrame))
		if n <= 0 {
			return false, nil
		}
		if err := c.fr.WriteData(st.id, false, st.out[:n]); err != nil {
			return true, err
		}
		c.sendConn -= n
		st.sendUsed += n
		st.out = st.out[n:]
	}
	return true, c.writeBlockLocked(st.id, st.trailers, true)
}

// pushBlockedLocked retries answers waiting for window, in order.
func (c *conn) pushBlockedLocked() error {
	if len(c.blocked) == 0 {
		return nil
	}
	keep := c.blocked[:0]
	var finished []*stream
	var err error
	for _, st := range c.blocked {
		if st.reset {
			finished = append(finished, st) // removal is idempotent
			continue
		}
		if err != nil {
			keep = append(keep, st)
			continue
		}
		var done bool
		if done, err = c.pushLocked(st); done {
			finished = append(finished, st)
		} else {
			keep = append(keep, st)
		}
	}
	clear(c.blocked[len(keep):])
	c.blocked = keep
	if len(finished) > 0 {
		// removeStream takes smu and may close: not under wmu.
		go func() {
			for _, st := range finished {
				c.removeStream(st)
			}
		}()
	}
	return err
}

// writeBlockLocked writes a header block, split into CONTINUATION frames if
// it is larger than the peer's frame size.
func (c *conn) writeBlockLocked(id uint32, block []byte, endStream bool) error {
	if !c.tableSized {
		c.tableSized = true
		block = append([]byte{0x20}, block...) // dynamic table size update: 0
	}
	first := block
	if len(first) > c.maxFrame {
		first = block[:c.maxFrame]
	}
	rest := block[len(first):]
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndStream: endStream, EndHeaders: len(rest) == 0}); err != nil {
		return err
	}
	for len(rest) > 0 {
		frag := rest
		if len(frag) > c.maxFrame {
			frag = rest[:c.maxFrame]
		}
		rest = rest[len(frag):]
		if err := c.fr.WriteContinuation(id, len(rest) == 0, frag); err != nil {
			return err
		}
	}
	return nil
}

// resetStream cancels a call the client reset: its answer is not written.
func (c *conn) resetStream(st *stream) {
	st.cancel()
	c.wmu.Lock()
	st.reset = true
	c.windowed.Broadcast() // a streaming send waiting for window gives up
	wasBlocked := false
	for i, b := range c.blocked {
		if b == st {
			c.blocked = append(c.blocked[:i], c.blocked[i+1:]...)
			wasBlocked = true
			break
		}
	}
	c.wmu.Unlock()
	if wasBlocked {
		// Its handler is done (finish left it waiting for window): nobody
		// else frees its slot.
		c.removeStream(st)
		return
	}
	if !st.ended {
		// No handler owns it: free the slot now. A running handler frees it
		// when it returns, so resets cannot pile up work.
		st.ended = true
		st.releaseMsg()
		c.removeStream(st)
	}
}

// bufPool holds request and answer buffers; the holders are pooled too so
// that putting one back allocates nothing.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(p *[]byte) {
	if cap(*p) > 64<<10 {
		return // let large buffers go
	}
	*p = (*p)[:0]
	bufPool.Put(p)
}
