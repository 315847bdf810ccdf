package valkey

import (
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
)

// setupError marks a failure before the connection answered anything: the
// TCP or TLS dial, or the HELLO handshake. valkey-go sends no user command on
// a connection before its HELLO is answered, so a call failing with it was
// certainly not applied and may be buffered and replayed.
type setupError struct{ err error }

func (e *setupError) Error() string { return e.err.Error() }
func (e *setupError) Unwrap() error { return e.err }

// dial is valkey-go's DialCtxFn: a plain or TLS dial whose errors, and the
// errors of the connection until it first delivers bytes, are setupErrors.
func dial(ctx context.Context, addr string, d *net.Dialer, conf *tls.Config) (net.Conn, error) {
	var (
		c   net.Conn
		err error
	)
	if conf != nil {
		td := tls.Dialer{NetDialer: d, Config: conf}
		c, err = td.DialContext(ctx, "tcp", addr)
	} else {
		c, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, &setupError{err: err}
	}
	return &setupConn{Conn: c}, nil
}

type setupConn struct {
	net.Conn
	answered atomic.Bool
}

func (c *setupConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.answered.Load() {
		c.answered.Store(true)
	}
	if err != nil && !c.answered.Load() {
		err = &setupError{err: err}
	}
	return n, err
}

func (c *setupConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil && !c.answered.Load() {
		err = &setupError{err: err}
	}
	return n, err
}
