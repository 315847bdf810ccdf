package valkeytest

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// echoServer echoes what each connection sends and records it; ended
// receives what a connection had sent once its client has closed it.
type echoServer struct {
	addr  string
	mu    sync.Mutex
	got   bytes.Buffer
	ended chan []byte
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{addr: ln.Addr().String(), ended: make(chan []byte, 16)}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { _ = c.Close() }() // test server
				var mine []byte
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						e.mu.Lock()
						e.got.Write(buf[:n])
						e.mu.Unlock()
						mine = append(mine, buf[:n]...)
						_, _ = c.Write(buf[:n]) // the client may be gone
					}
					if err != nil {
						e.ended <- mine
						return
					}
				}
			}()
		}
	}()
	return e
}

func (e *echoServer) received() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.got.Len()
}

func dialProxy(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg and reads the echo, returning how long it took.
func roundTrip(t *testing.T, c net.Conn, msg string) time.Duration {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	t0 := time.Now()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo %q: %q, %v", msg, buf, err)
	}
	return time.Since(t0)
}

func TestProxyLoopbackOnly(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:6379": true, "[::1]:6379": true, "127.9.9.9:1": true,
		"192.0.2.1:6379": false, "10.0.0.1:6379": false, "localhost:6379": false, "127.0.0.1": false} {
		if got := loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// TestProxyHold: held bytes reach neither side, and flow once the mode is
// Pass again, on the same connection.
func TestProxyHold(t *testing.T) {
	e := startEcho(t)
	p := StartProxy(t, e.addr)
	c := dialProxy(t, p)
	roundTrip(t, c, "before")
	p.Hold(false)
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := c.Read(make([]byte, 16)); n != 0 || !isTimeout(err) {
		t.Fatalf("read during Hold: %d bytes, %v; want a timeout", n, err)
	}
	if got := e.received(); got != len("before") {
		t.Fatalf("server received %d bytes during Hold, want only the %d before it", got, len("before"))
	}
	p.Pass()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after Pass: %q, %v; want the held bytes echoed", buf, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestProxyHoldClientCloses: a client closing during Hold has its held
// request delivered to the server, or dropped.
func TestProxyHoldClientCloses(t *testing.T) {
	for _, deliver := range []bool{true, false} {
		e := startEcho(t)
		p := StartProxy(t, e.addr)
		c := dialProxy(t, p)
		roundTrip(t, c, "x")
		p.Hold(deliver)
		if _, err := c.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		waitReceived(t, p, int64(len("xrequest")))
		_ = c.Close()
		var got []byte
		select {
		case got = <-e.ended:
		case <-time.After(10 * time.Second):
			t.Fatal("the server's connection did not end after the client closed")
		}
		want := "x"
		if deliver {
			want = "xrequest"
		}
		st := p.Stats()
		if string(got) != want || st.Delivered+st.Dropped != 1 || (st.Delivered == 1) != deliver {
			t.Fatalf("deliver=%v: server got %q, want %q; stats %+v", deliver, got, want, st)
		}
	}
}

// TestProxyPassClientCloses: what a client sent before closing reaches the
// server, though the echo back to the closed client fails first (as over
// TCP; a held request released by Pass after its client closed too).
func TestProxyPassClientCloses(t *testing.T) {
	for _, hold := range []bool{false, true} {
		e := startEcho(t)
		p := StartProxy(t, e.addr)
		c := dialProxy(t, p)
		roundTrip(t, c, "x")
		if hold {
			p.Hold(true)
		}
		if _, err := c.Write([]byte("last")); err != nil {
			t.Fatal(err)
		}
		if hold {
			waitReceived(t, p, int64(len("xlast")))
			p.Pass()
		}
		_ = c.Close()
		select {
		case got := <-e.ended:
			if string(got) != "xlast" {
				t.Fatalf("hold=%v: server got %q, want %q", hold, got, "xlast")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the server's connection did not end after the client closed")
		}
	}
}

// TestProxyDelay: a round trip takes at least twice the delay (a lower
// bound: a delay cannot be shortened by a busy machine).
func TestProxyDelay(t *testing.T) {
	e := startEcho(t)
	p := StartProxy(t, e.addr)
	c := dialProxy(t, p)
	control := roundTrip(t, c, "a")
	const d = 60 * time.Millisecond
	p.Delay(d)
	if rt := roundTrip(t, c, "b"); rt < 2*d {
		t.Fatalf("round trip with Delay(%v): %v, want >= %v (control %v)", d, rt, 2*d, control)
	}
	p.Pass()
	roundTrip(t, c, "c")
}

// TestProxyReset: the next chunk resets the connection (the client reads
// ECONNRESET); after Pass a new connection works.
func TestProxyReset(t *testing.T) {
	e := startEcho(t)
	p := StartProxy(t, e.addr)
	c := dialProxy(t, p)
	roundTrip(t, c, "a")
	p.Reset()
	if _, err := c.Write([]byte("b")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 4)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after Reset: %v, want ECONNRESET", err)
	}
	if p.Stats().Resets < 1 {
		t.Fatalf("stats %+v: no reset counted", p.Stats())
	}
	p.Pass()
	roundTrip(t, dialProxy(t, p), "c")
}

// TestProxyThrottle: 16 KiB at 32 KiB/s take at least (16 KiB - one piece)
// / rate (a lower bound), and arrive whole.
func TestProxyThrottle(t *testing.T) {
	e := startEcho(t)
	p := StartProxy(t, e.addr)
	c := dialProxy(t, p)
	roundTrip(t, c, "a")
	const rate, size = 32 << 10, 16 << 10
	p.Throttle(rate)
	msg := string(bytes.Repeat([]byte("z"), size))
	if rt, min := roundTrip(t, c, msg), time.Duration(size-throttlePiece)*time.Second/rate; rt < min {
		t.Fatalf("%d bytes through a %d B/s link and back in %v, want >= %v", size, rate, rt, min)
	}
}

// waitReceived waits until the proxy has read n bytes from its clients, so
// what a test sends in a mode is known to be taken in that mode.
func waitReceived(t *testing.T, p *Proxy, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.Stats().Received < n {
		if time.Now().After(deadline) {
			t.Fatalf("proxy read %d bytes from its clients in 10 s, want %d", p.Stats().Received, n)
		}
		time.Sleep(time.Millisecond) // poll interval
	}
}
