package valkeytest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a loopback TCP proxy in front of one server, whose fault a test
// switches on and off while traffic flows through it. Every connection a
// client opens to Addr is forwarded to its own connection to the upstream;
// the mode applies to all of them at once:
//
//   - Pass forwards bytes as they come.
//   - Hold is a black hole that closes nothing: bytes are read and kept in
//     both directions (TCP sees a healthy peer) and forwarded, in order, when
//     the mode changes. A client that closes its connection meanwhile has
//     its held requests delivered to the server (the request was applied,
//     its answer lost) or dropped, as Hold's argument says.
//   - Delay forwards every chunk no earlier than its arrival plus a delay,
//     in both directions (a round trip gains twice the delay; throughput is
//     kept).
//   - Reset answers the next chunk of a connection, in either direction, by
//     resetting it (RST to the client, the upstream closed): a request is
//     forwarded first on every other reset, so some reset requests were
//     applied and some never arrived; a reply is never forwarded.
//   - Throttle forwards at most a given number of bytes per second in each
//     direction, shared by all connections (one slow link).
//
// Both ends are loopback addresses (StartProxy refuses anything else). Bytes
// held or queued are bounded per connection and direction (maxHeld); a
// source past the bound waits, as TCP would make it.
type Proxy struct {
	// Addr is the host:port clients dial (127.0.0.1, a free port).
	Addr     string
	upstream string
	ln       net.Listener

	mode    atomic.Int32
	deliver atomic.Bool  // Hold: a closing client's held requests reach the server
	delay   atomic.Int64 // Delay, ns
	rate    atomic.Int64 // Throttle, bytes/s per direction
	sig     atomic.Pointer[chan struct{}]
	links   [2]link // Throttle: one per direction (toServer, toClient)

	accepted, delivered, dropped, resets atomic.Int64
	received                             atomic.Int64 // bytes read from clients

	mu     sync.Mutex
	conns  map[*proxyConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Mode is what a Proxy does to the bytes it forwards.
type Mode int32

// Modes.
const (
	Pass Mode = iota
	Hold
	Delay
	Reset
	Throttle
)

var modeNames = [...]string{"pass", "hold", "delay", "reset", "throttle"}

func (m Mode) String() string { return modeNames[m] }

// maxHeld bounds the bytes a proxy keeps per connection and direction.
const maxHeld = 32 << 20

// throttlePiece is the most bytes Throttle writes at once, so a slow link
// delivers a steady stream rather than a burst per chunk.
const throttlePiece = 1 << 10

// ProxyStats count what a proxy did.
type ProxyStats struct {
	Accepted  int64 // client connections accepted
	Delivered int64 // Hold: connections closed by their client whose held requests were delivered
	Dropped   int64 // Hold: connections closed by their client whose held requests were dropped
	Resets    int64 // Reset: connections reset
	// Received counts the bytes read from clients and queued for their
	// server (to be held, delayed or forwarded as the mode says), so a test
	// can wait until the proxy has a request instead of sleeping.
	Received int64
}

// StartProxy starts a proxy to upstream (a loopback host:port) on a free
// loopback port, in Pass mode, and closes it (every connection too) when the
// test ends.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	if !loopback(upstream) {
		t.Fatalf("proxy upstream %q: want a loopback host:port", upstream)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), upstream: upstream, ln: ln, conns: map[*proxyConn]struct{}{}}
	ch := make(chan struct{})
	p.sig.Store(&ch)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// loopback reports whether addr is a host:port on loopback.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	return err == nil && ip != nil && ip.IsLoopback()
}

// Pass forwards bytes as they come (and releases what Hold kept).
func (p *Proxy) Pass() { p.set(Pass) }

// Hold keeps every byte in both directions without closing anything, until
// the mode changes. deliver says what becomes of the requests held on a
// connection its client closes meanwhile: written to the server before its
// side is closed (true), or dropped.
func (p *Proxy) Hold(deliver bool) {
	p.deliver.Store(deliver)
	p.set(Hold)
}

// Delay forwards each chunk d after it arrived, in both directions.
func (p *Proxy) Delay(d time.Duration) {
	p.delay.Store(int64(d))
	p.set(Delay)
}

// Reset resets each connection at its next chunk (see Proxy).
func (p *Proxy) Reset() { p.set(Reset) }

// Throttle limits each direction to bytesPerSec, shared by all connections.
func (p *Proxy) Throttle(bytesPerSec int) {
	if bytesPerSec <= 0 {
		bytesPerSec = 1
	}
	p.rate.Store(int64(bytesPerSec))
	for i := range p.links {
		p.links[i].restart()
	}
	p.set(Throttle)
}

// Mode returns the current mode.
func (p *Proxy) Mode() Mode { return Mode(p.mode.Load()) }

// Stats returns what the proxy did so far.
func (p *Proxy) Stats() ProxyStats {
	return ProxyStats{Accepted: p.accepted.Load(), Delivered: p.delivered.Load(), Dropped: p.dropped.Load(), Resets: p.resets.Load(), Received: p.received.Load()}
}

// set switches the mode and wakes every writer waiting on the old one.
func (p *Proxy) set(m Mode) {
	p.mode.Store(int32(m))
	ch := make(chan struct{})
	close(*p.sig.Swap(&ch))
}

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines. Safe to call twice.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.ln.Close() // ends accept
	for c := range p.conns {
		c.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		cc, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		sc, err := net.DialTimeout("tcp", p.upstream, time.Second)
		if err != nil {
			_ = cc.Close() // upstream down: the client sees its connection closed
			continue
		}
		c := &proxyConn{client: cc.(*net.TCPConn), server: sc.(*net.TCPConn), done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.close()
			return
		}
		p.conns[c] = struct{}{}
		p.wg.Add(4)
		p.mu.Unlock()
		toServer, toClient := make(chan chunk, 1024), make(chan chunk, 1024)
		go p.read(c, c.client, toServer)
		go p.read(c, c.server, toClient)
		go p.forward(c, toServer, dirToServer)
		go p.forward(c, toClient, dirToClient)
	}
}

type proxyConn struct {
	client, server *net.TCPConn
	done           chan struct{}
	once           sync.Once
	exited         atomic.Int32 // forwarders done
}

// close closes both sides (once); reset sends the client an RST instead of
// a FIN.
func (c *proxyConn) close() { c.closeWith(false) }

func (c *proxyConn) closeWith(reset bool) {
	c.once.Do(func() {
		close(c.done)
		if reset {
			_ = c.client.SetLinger(0) // Close then sends RST
		}
		_ = c.client.Close() // teardown: the other side's reader reports the end
		_ = c.server.Close()
	})
}

type chunk struct {
	b  []byte
	at time.Time
}

const (
	dirToServer = 0
	dirToClient = 1
)

// read queues what src sends until it ends or the connection closes.
func (p *Proxy) read(c *proxyConn, src net.Conn, q chan<- chunk) {
	defer p.wg.Done()
	defer close(q)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case q <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now()}:
			case <-c.done:
				return
			}
			if src == c.client {
				p.received.Add(int64(n))
			}
		}
		if err != nil {
			return
		}
	}
}

// forward writes the chunks of q to the other side as the mode says until
// q ends (the source closed) or a write fails, then closes its destination
// only: the other direction still writes what it has read (a request sent
// before its client closed reaches the server, as over TCP), then finds its
// own source closed. The connection is forgotten when both are done.
func (p *Proxy) forward(c *proxyConn, q <-chan chunk, dir int) {
	defer p.wg.Done()
	dst := c.server
	if dir == dirToClient {
		dst = c.client
	}
	defer func() {
		_ = dst.Close() // ends the other direction's reader
		if c.exited.Add(1) == 2 {
			p.forget(c)
		}
	}()
	f := &forwarder{p: p, c: c, q: q, dst: dst, dir: dir}
	for f.step() {
	}
}

func (p *Proxy) forget(c *proxyConn) {
	c.close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// forwarder is one direction of one connection: the chunks taken from its
// queue and not yet written (held), in order.
type forwarder struct {
	p       *Proxy
	c       *proxyConn
	q       <-chan chunk
	dst     *net.TCPConn
	dir     int
	held    []chunk
	bytes   int
	srcDone bool
}

// step waits for work, acts on the mode for the oldest held chunk, and
// reports whether to go on.
func (f *forwarder) step() bool {
	if len(f.held) == 0 {
		if f.srcDone {
			return false
		}
		select {
		case ch, ok := <-f.q:
			f.take(ch, ok)
		case <-f.c.done:
			return false
		}
		return true
	}
	f.drain()
	sig := *f.p.sig.Load() // before reading the mode: a change after it wakes us
	switch f.p.Mode() {
	case Hold:
		return f.hold(sig)
	case Reset:
		f.reset()
		return false
	case Delay:
		if !f.wait(f.held[0].at.Add(time.Duration(f.p.delay.Load())), sig) {
			return true // the mode changed: act on the new one
		}
	case Throttle:
		piece := min(len(f.held[0].b), throttlePiece)
		if !f.wait(f.p.links[f.dir].reserve(piece, f.p.rate.Load()), sig) {
			return true
		}
		return f.write(piece)
	}
	return f.write(len(f.held[0].b))
}

// take keeps a chunk read from the queue, or notes the source's end.
func (f *forwarder) take(ch chunk, ok bool) {
	if !ok {
		f.srcDone = true
		return
	}
	f.held = append(f.held, ch)
	f.bytes += len(ch.b)
}

// drain takes whatever else is queued, within the bound.
func (f *forwarder) drain() {
	for !f.srcDone && f.bytes < maxHeld {
		select {
		case ch, ok := <-f.q:
			f.take(ch, ok)
		default:
			return
		}
	}
}

// hold keeps the chunks until the mode changes; if the source ends first,
// the held requests of a closing client are delivered or dropped.
func (f *forwarder) hold(sig chan struct{}) bool {
	if f.srcDone {
		if f.dir == dirToServer {
			if f.p.deliver.Load() {
				f.p.delivered.Add(1)
				for len(f.held) > 0 && f.write(len(f.held[0].b)) {
				}
			} else {
				f.p.dropped.Add(1)
			}
		}
		return false
	}
	q := f.q
	if f.bytes >= maxHeld {
		q = nil // full: the source waits
	}
	select {
	case <-sig:
	case ch, ok := <-q:
		f.take(ch, ok)
	case <-f.c.done:
		return false
	}
	return true
}

// reset resets the connection: a request is forwarded first on every other
// reset, a reply never.
func (f *forwarder) reset() {
	n := f.p.resets.Add(1)
	if f.dir == dirToServer && n%2 == 1 {
		f.write(len(f.held[0].b))
	}
	f.c.closeWith(true)
}

// wait sleeps until t; false if the mode changed first.
func (f *forwarder) wait(t time.Time, sig chan struct{}) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-sig:
		return false
	case <-f.c.done:
		return true // the write below fails and ends the forwarder
	}
}

// write writes the first n bytes of the oldest held chunk.
func (f *forwarder) write(n int) bool {
	h := &f.held[0]
	if _, err := f.dst.Write(h.b[:n]); err != nil {
		return false
	}
	f.bytes -= n
	if h.b = h.b[n:]; len(h.b) == 0 {
		f.held[0] = chunk{}
		f.held = f.held[1:]
	}
	return true
}

// link is one direction of a throttled link: when its next byte may go.
type link struct {
	mu   sync.Mutex
	next time.Time
}

func (l *link) restart() {
	l.mu.Lock()
	l.next = time.Time{}
	l.mu.Unlock()
}

// reserve books n bytes at rate bytes/s and returns when they have gone
// through the link.
func (l *link) reserve(n int, rate int64) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); l.next.Before(now) {
		l.next = now
	}
	l.next = l.next.Add(time.Duration(int64(n) * int64(time.Second) / rate))
	return l.next
}
