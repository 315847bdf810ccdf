package xds_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/xds"
)

// freezer forwards TCP connections to a target. After freeze, the
// connections it holds stay open but carry nothing either way, as when the
// server's node dies or a route drops its packets: no FIN, no RST, the
// peer's kernel never says the connection is gone. New connections are
// forwarded as before.
type freezer struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  []*atomic.Bool // frozen flag of each held connection
	closed []net.Conn
}

func startFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target}
	go f.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.closed {
			_ = c.Close()
		}
	})
	return f
}

func (f *freezer) accept() {
	for {
		in, err := f.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", f.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		frozen := new(atomic.Bool)
		f.mu.Lock()
		f.conns = append(f.conns, frozen)
		f.closed = append(f.closed, in, out)
		f.mu.Unlock()
		go pump(in, out, frozen)
		go pump(out, in, frozen)
	}
}

// pump copies src to dst until src fails; once frozen it reads and drops.
func pump(src, dst net.Conn, frozen *atomic.Bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !frozen.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !frozen.Load() {
				_ = dst.Close()
			}
			return
		}
	}
}

// freeze silences every connection held now.
func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Store(true)
	}
}

// A server that goes silent without closing the connection (its node died,
// or a network path drops packets) must not hold the client on a dead
// stream: grpc-go's dialer leaves TCP keepalive at the OS defaults (two
// hours on Linux before the first probe), so without HTTP/2 keepalive
// pings the client would miss every config the restarted Envoy Gateway
// publishes for hours. The client pings when the stream has been quiet for
// KeepaliveTime and reconnects when no answer comes within
// KeepaliveTimeout.
func TestSilentServerIsDetectedByKeepalive(t *testing.T) {
	t.Parallel()
	eg := startEG(t, "127.0.0.1:0", nil)
	eg.set("1", cfg("llm/budgets", 1))
	fz := startFreezer(t, eg.addr)
	var got applied
	c, err := xds.New(xds.Options{
		ServerURL: fz.ln.Addr().String(), Apply: got.apply, Logger: quietLogger(),
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		// grpc-go raises a client's keepalive time to 10 s at least.
		KeepaliveTime: 10 * time.Second, KeepaliveTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	eventually(t, "version 1 applied", func() bool { return c.Version() == "1" })

	fz.freeze()
	eg.set("2", cfg("llm/budgets", 2))
	frozeAt := time.Now()
	deadline := time.After(40 * time.Second)
	for c.Version() != "2" {
		select {
		case <-deadline:
			t.Fatalf("version 2 not applied %v after the server went silent; stats %+v", time.Since(frozeAt), c.Stats())
		case <-time.After(50 * time.Millisecond): // poll interval
		}
	}
	if st := c.Stats(); st.Connects < 2 {
		t.Errorf("stats %+v: want a second connection", st)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v", err)
	}
}
