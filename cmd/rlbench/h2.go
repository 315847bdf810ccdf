package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
)

// h2Client is a minimal gRPC-over-HTTP/2 client for ShouldRateLimit: request
// header blocks are encoded once (literal, never indexed, so they need no
// HPACK state), request bodies are pre-encoded, writes from all workers are
// batched by one writer goroutine, and only the response's overall_code is
// decoded. It spends far less CPU per call than grpc-go's client, so on a
// shared 2-core machine more CPU is left to the services being compared. It
// is a load generator, not a general client: no retries, no TLS.
// Request headers are HPACK-indexed like a real client's, so servers pay the
// usual header-decoding cost.
type h2Client struct {
	conn     net.Conn
	hdrFirst []byte // adds the headers to the dynamic table
	hdr      []byte // indexes them
	fr       *http2.Framer
	wmu      sync.Mutex
	wq       []wreq
	wcond    *sync.Cond
	closed   bool
	err      error

	mu     sync.Mutex // guards err and calls; taken inside wmu, never around it
	nextID uint32     // guarded by wmu
	calls  map[uint32]*h2call

	// Reader-goroutine state: the HPACK decoder and what it emitted for the
	// header block being decoded.
	hdec       *hpack.Decoder
	hStatus    string
	hGRPCState string
}

func (c *h2Client) emit(f hpack.HeaderField) {
	switch f.Name {
	case ":status":
		c.hStatus = f.Value
	case "grpc-status":
		c.hGRPCState = f.Value
	}
}

type wreq struct {
	id   uint32
	body []byte
	ctrl func(*http2.Framer) error
}

type h2call struct {
	done   chan struct{}
	data   []byte
	status string
	err    error
}

const methodPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

func dialH2(addr string) (*h2Client, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	// Like grpc-go's and Envoy's clients, index the headers in HPACK's
	// dynamic table: the first block adds them, every later block is the
	// same few index bytes (the writer sends blocks in stream order, so the
	// server's table always matches).
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	block := func() ([]byte, error) {
		hb.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", methodPath}, {":authority", addr},
			{"content-type", "application/grpc"}, {"te", "trailers"}} {
			if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
				return nil, err
			}
		}
		return bytes.Clone(hb.Bytes()), nil
	}
	first, err := block()
	if err != nil {
		return nil, err
	}
	rest, err := block()
	if err != nil {
		return nil, err
	}
	c := &h2Client{conn: conn, hdrFirst: first, hdr: rest, nextID: 1, calls: map[uint32]*h2call{}}
	c.wcond = sync.NewCond(&c.wmu)
	bw := bufio.NewWriterSize(conn, 64<<10)
	if _, err := bw.WriteString(http2.ClientPreface); err != nil {
		return nil, err
	}
	wfr := http2.NewFramer(bw, nil)
	if err := wfr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1}, http2.Setting{ID: http2.SettingHeaderTableSize, Val: 4096}); err != nil {
		return nil, err
	}
	if err := wfr.WriteWindowUpdate(0, 1<<30); err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	// Header blocks are decoded by the reader itself (no MetaHeadersFrame:
	// that allocates a field slice and strings per block); the emit callback
	// keeps only :status and grpc-status, which the server sends indexed.
	c.fr = http2.NewFramer(nil, bufio.NewReaderSize(conn, 64<<10))
	c.hdec = hpack.NewDecoder(4096, c.emit)
	go c.writer(bw, wfr)
	go c.reader()
	return c, nil
}

func (c *h2Client) writer(bw *bufio.Writer, fr *http2.Framer) {
	var batch []wreq
	for {
		c.wmu.Lock()
		for len(c.wq) == 0 && !c.closed {
			c.wcond.Wait()
		}
		if c.closed {
			c.wmu.Unlock()
			return
		}
		batch, c.wq = c.wq, batch[:0]
		c.wmu.Unlock()
		for _, r := range batch {
			var err error
			if r.ctrl != nil {
				err = r.ctrl(fr)
			} else {
				hdr := c.hdr
				if r.id == 1 {
					hdr = c.hdrFirst
				}
				err = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: r.id, BlockFragment: hdr, EndHeaders: true})
				if err == nil {
					err = fr.WriteData(r.id, true, r.body)
				}
			}
			if err != nil {
				c.fail(err)
				return
			}
		}
		if err := bw.Flush(); err != nil {
			c.fail(err)
			return
		}
	}
}

func (c *h2Client) enqueue(r wreq) {
	c.wmu.Lock()
	c.wq = append(c.wq, r)
	c.wmu.Unlock()
	c.wcond.Signal()
}

func (c *h2Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	calls := c.calls
	c.calls = map[uint32]*h2call{}
	c.mu.Unlock()
	for _, call := range calls {
		call.err = err
		close(call.done)
	}
}

func (c *h2Client) reader() {
	var unacked uint32
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.fail(err)
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.enqueue(wreq{ctrl: func(fr *http2.Framer) error { return fr.WriteSettingsAck() }})
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				d := f.Data
				c.enqueue(wreq{ctrl: func(fr *http2.Framer) error { return fr.WritePing(true, d) }})
			}
		case *http2.GoAwayFrame:
			c.fail(fmt.Errorf("goaway: %v", f.ErrCode))
			return
		case *http2.DataFrame:
			unacked += uint32(len(f.Data()))
			if unacked > 1<<20 {
				n := unacked
				unacked = 0
				c.enqueue(wreq{ctrl: func(fr *http2.Framer) error { return fr.WriteWindowUpdate(0, n) }})
			}
			c.mu.Lock()
			call := c.calls[f.StreamID]
			c.mu.Unlock()
			if call != nil {
				call.data = append(call.data, f.Data()...)
			}
		case *http2.HeadersFrame:
			if !f.HeadersEnded() {
				// The services answer with one frame per block; CONTINUATION
				// is not supported by this load generator.
				c.fail(fmt.Errorf("stream %d: header block split into CONTINUATION frames", f.StreamID))
				return
			}
			c.hStatus, c.hGRPCState = "", ""
			if _, err := c.hdec.Write(f.HeaderBlockFragment()); err != nil {
				c.fail(fmt.Errorf("stream %d: hpack: %w", f.StreamID, err))
				return
			}
			if err := c.hdec.Close(); err != nil {
				c.fail(fmt.Errorf("stream %d: hpack: %w", f.StreamID, err))
				return
			}
			c.mu.Lock()
			call := c.calls[f.StreamID]
			if call != nil && f.StreamEnded() {
				delete(c.calls, f.StreamID)
			}
			c.mu.Unlock()
			if call == nil {
				continue
			}
			if s := c.hStatus; s != "" && s != "200" {
				call.err = fmt.Errorf("http status %s", s)
			}
			if v := c.hGRPCState; v != "" {
				call.status = v
			}
			if f.StreamEnded() {
				close(call.done)
			}
		case *http2.RSTStreamFrame:
			c.mu.Lock()
			call := c.calls[f.StreamID]
			delete(c.calls, f.StreamID)
			c.mu.Unlock()
			if call != nil {
				call.err = fmt.Errorf("rst_stream %v", f.ErrCode)
				close(call.done)
			}
		}
	}
}

var errTimeout = errors.New("call timed out")

// call sends one pre-framed gRPC message (5-byte prefix included) and returns
// the response's overall_code (1 OK, 2 OVER_LIMIT).
func (c *h2Client) call(body []byte, timeout time.Duration) (int, error) {
	call := &h2call{done: make(chan struct{})}
	// Stream ids must reach the wire in increasing order: allocate and
	// queue under the writer's lock.
	c.wmu.Lock()
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		c.wmu.Unlock()
		return 0, err
	}
	id := c.nextID
	c.nextID += 2
	c.calls[id] = call
	c.mu.Unlock()
	c.wq = append(c.wq, wreq{id: id, body: body})
	c.wmu.Unlock()
	c.wcond.Signal()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-call.done:
	case <-t.C:
		c.mu.Lock()
		delete(c.calls, id)
		c.mu.Unlock()
		return 0, errTimeout
	}
	if call.err != nil {
		return 0, call.err
	}
	if call.status != "0" {
		return 0, fmt.Errorf("grpc-status %s", call.status)
	}
	return overallCode(call.data)
}

func (c *h2Client) Close() {
	c.wmu.Lock()
	c.closed = true
	c.wmu.Unlock()
	c.wcond.Broadcast()
	_ = c.conn.Close()
}

// frame prefixes a marshalled request with gRPC's 5-byte message header.
func frame(msg []byte) []byte {
	out := make([]byte, 5+len(msg))
	out[1], out[2], out[3], out[4] = byte(len(msg)>>24), byte(len(msg)>>16), byte(len(msg)>>8), byte(len(msg))
	copy(out[5:], msg)
	return out
}

func overallCode(data []byte) (int, error) {
	if len(data) < 5 || data[0] != 0 {
		return 0, fmt.Errorf("malformed grpc message (%d bytes)", len(data))
	}
	b := data[5:]
	code := 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			code = int(v)
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return code, nil
}
