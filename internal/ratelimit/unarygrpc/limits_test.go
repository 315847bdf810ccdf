package unarygrpc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/budgetgen/budgetgen/internal/syncbuf"
)

// flakyListener fails Accept with err the first n times.
type flakyListener struct {
	net.Listener
	n   int
	err error
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.n > 0 {
		l.n--
		return nil, l.err
	}
	return l.Listener.Accept()
}

// Out of file descriptors, Accept fails with EMFILE: the server backs off
// and keeps accepting (it used to return, and the process exited).
func TestAcceptSurvivesTemporaryErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	s := New(Options{})
	s.Handle("/t.S/Echo", echo)
	done := make(chan error, 1)
	go func() { done <- s.Serve(&flakyListener{Listener: l, n: 5, err: emfile}) }()
	defer func() {
		s.Stop()
		if err := <-done; !errors.Is(err, ErrServerStopped) {
			t.Errorf("Serve: %v", err)
		}
	}()
	cc := dial(t, l.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := call(ctx, cc, "/t.S/Echo", []byte("ab")); err != nil || string(out) != "ba" {
		t.Fatalf("call after EMFILE: %q %v", out, err)
	}
	if n := s.Stats().AcceptErrors; n != 5 {
		t.Errorf("AcceptErrors %d, want 5", n)
	}

	// A permanent error still ends Serve.
	s2 := New(Options{})
	bad := &flakyListener{Listener: l, n: 1, err: errors.New("listener broken")}
	if err := s2.Serve(bad); err == nil || err.Error() != "listener broken" {
		t.Errorf("Serve with a permanent error: %v", err)
	}
}

func TestMaxConnections(t *testing.T) {
	ts := serve(t, Options{MaxConnections: 2}, map[string]Handler{"/t.S/Echo": echo})
	r1, r2 := dialRaw(t, ts.addr), dialRaw(t, ts.addr)
	for _, r := range []*raw{r1, r2} {
		r.until("SETTINGS", func(f http2.Frame) bool { _, ok := f.(*http2.SettingsFrame); return ok })
	}
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if n, err := io.ReadAll(c); err != nil || len(n) != 0 {
		t.Errorf("third connection: read %d bytes, %v; want closed at once", len(n), err)
	}
	if st := ts.s.Stats(); st.Refused != 1 || st.Open != 2 {
		t.Errorf("stats %+v, want 1 refused and 2 open", st)
	}
	// A slot freed is usable again.
	r1.c.Close()
	waitFor(t, "the closed connection's slot to be freed", func() bool { return ts.s.Stats().Open <= 1 })
	r3 := dialRaw(t, ts.addr)
	r3.headers(1, "/t.S/Echo", "application/grpc", false)
	r3.message(1, []byte("x"))
	r3.until("answer", func(f http2.Frame) bool { h, ok := f.(*http2.MetaHeadersFrame); return ok && h.StreamEnded() })
}

// An idle connection gets GOAWAY NO_ERROR after IdleTimeout and is
// closed; one with a call in flight is not, however long the call.
func TestIdleTimeout(t *testing.T) {
	block := make(chan struct{})
	ts := serve(t, Options{IdleTimeout: 200 * time.Millisecond}, map[string]Handler{
		"/t.S/Echo":  echo,
		"/t.S/Block": func(_ context.Context, _, dst []byte) ([]byte, error) { <-block; return dst, nil },
	})
	// start comes before the dial: the server's idle clock for a connection
	// cannot start before the connection exists, so a GOAWAY read less than
	// IdleTimeout after start is early however the scheduler runs.
	start := time.Now()
	idle := dialRaw(t, ts.addr)
	busy := dialRaw(t, ts.addr)
	busy.headers(1, "/t.S/Block", "application/grpc", false)
	busy.message(1, nil)
	if code := readGoAway(t, idle); code != http2.ErrCodeNo {
		t.Errorf("idle connection: GOAWAY %v", code)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("closed after %v, before the idle timeout", d)
	}
	// This sleep is the behaviour under test, not synchronisation: busy's
	// call stays in flight past its IdleTimeout too (its idle check runs at
	// 200 ms and again every 200 ms). A late scheduler can only make the
	// check run later, never make a GOAWAY appear, so the assertion below
	// cannot fail from load.
	time.Sleep(300 * time.Millisecond)
	close(block)
	got := map[string]bool{}
	busy.until("answer to the blocked call", func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			got["goaway"] = true
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				return true
			}
		}
		return false
	})
	if got["goaway"] {
		t.Error("a connection with a call in flight got GOAWAY for idleness")
	}
	if st := ts.s.Stats(); st.IdleClosed < 1 {
		t.Errorf("stats %+v, want an idle close", st)
	}
}

// TestRefusalsLoggedOncePerInterval: connections refused at MaxConnections
// are counted each, and logged once per RefusalLogInterval, not once per
// connection (a client fleet over the cap would flood the log); the line
// names the cap. Stats reports the cap.
func TestRefusalsLoggedOncePerInterval(t *testing.T) {
	logs := &syncbuf.Buffer{}
	ts := serve(t, Options{MaxConnections: 1, Logger: slog.New(slog.NewTextHandler(logs, nil))}, map[string]Handler{"/t.S/Echo": echo})
	r := dialRaw(t, ts.addr)
	r.until("SETTINGS", func(f http2.Frame) bool { _, ok := f.(*http2.SettingsFrame); return ok })
	for range 5 {
		c, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.ReadAll(c) // closed at accept
		c.Close()
	}
	waitFor(t, "5 refusals counted", func() bool { return ts.s.Stats().Refused == 5 })
	if st := ts.s.Stats(); st.Max != 1 {
		t.Errorf("stats %+v, want the cap 1", st)
	}
	if n := strings.Count(logs.String(), "connections refused"); n != 1 || !strings.Contains(logs.String(), "max_connections=1") {
		t.Errorf("%d refusal lines, want 1 naming the cap:\n%s", n, logs)
	}
}
