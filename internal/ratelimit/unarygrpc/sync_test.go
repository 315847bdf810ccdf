package unarygrpc

import (
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// waitBound bounds a wait for something that must happen: far longer than it
// takes on a loaded machine, so only a real hang reaches it.
const waitBound = 10 * time.Second

// waitFor polls cond until it holds; the test fails after waitBound. Tests
// use it where the server gives no signal to wait on (a stream removed, a
// connection closed), instead of a fixed sleep that a busy scheduler
// outlasts.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after %v for %s", waitBound, what)
		}
		time.Sleep(time.Millisecond) // poll interval
	}
}

// barrier sends a PING and reads until its ack, passing every frame read on
// the way to seen (nil: ignored). The server handles a connection's frames
// in order and queues what handling one writes before the ack of a later
// PING, so once the ack is read the server has handled everything sent
// before it, and written what that handling wrote.
func (r *raw) barrier(data [8]byte, seen func(http2.Frame)) {
	r.t.Helper()
	if err := r.fr.WritePing(false, data); err != nil {
		r.t.Fatal(err)
	}
	r.until("PING ack (barrier)", func(f http2.Frame) bool {
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() && p.Data == data {
			return true
		}
		if seen != nil {
			seen(f)
		}
		return false
	})
}

// serverStreams counts the streams the server's connections hold.
func serverStreams(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		c.smu.Lock()
		n += len(c.streams)
		c.smu.Unlock()
	}
	return n
}

// serverHeld sums the request bytes the server's connections hold.
func serverHeld(s *Server) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for c := range s.conns {
		n += c.held.Load()
	}
	return n
}
