package server

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An idle HTTP keep-alive connection is closed by the server after
// IdleTimeout (net/http keeps it forever when the timeout is 0); one in use
// answers as before.
func TestHTTPIdleKeepAliveClosed(t *testing.T) {
	r := start(t, Options{IdleTimeout: 300 * time.Millisecond}, nil)
	addr := strings.TrimPrefix(r.http, "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	// start is taken before the last request is written: the server's idle
	// clock cannot start before it has read that request, so a close less
	// than IdleTimeout after start is early however late this goroutine
	// runs (taking it after reading the answer failed under load).
	var start time.Time
	for i := 0; i < 2; i++ { // two requests on one connection: keep-alive works
		start = time.Now()
		if _, err := io.WriteString(c, "GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle keep-alive connection: %v, want EOF (closed by the server)", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("closed after %v, before the idle timeout", d)
	}
}
