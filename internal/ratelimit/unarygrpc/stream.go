package unarygrpc

import (
	"context"
	"encoding/binary"
)

// ServerStreamHandler serves a server-streaming method: one request, any
// number of answers. send writes one message, waiting for flow-control
// window when it must; it fails once the client has reset the stream or the
// connection is gone. Returning ends the call with err's status (nil: OK).
// ctx is canceled like a unary handler's. req is only valid until the
// handler returns.
type ServerStreamHandler func(ctx context.Context, req []byte, send func(msg []byte) error) error

// HandleServerStream registers h for the full method name
// "/package.Service/Method". Call it before Serve. The gRPC health service's
// Watch is the one such method the rate limit service serves.
func (s *Server) HandleServerStream(fullMethod string, h ServerStreamHandler) {
	s.streams[fullMethod] = h
}

// runStream runs a server-streaming call to its end.
func (c *conn) runStream(st *stream) {
	err := st.sh(st, st.req, func(msg []byte) error { return c.sendMessage(st, msg) })
	c.write(func() error {
		if st.reset {
			return nil
		}
		if !st.headersSent {
			// Nothing was sent: a trailers-only answer.
			return c.writeBlockLocked(st.id, statusTrailers(nil, 200, errOrOK(err)), true)
		}
		return c.writeBlockLocked(st.id, statusOnlyTrailers(nil, err), true)
	})
	st.releaseMsg()
	c.removeStream(st)
}

// errOrOK makes a nil error an OK status for statusTrailers.
func errOrOK(err error) error {
	if err == nil {
		return statusError{code: 0}
	}
	return err
}

// sendMessage writes one message of a streaming call, in as many DATA
// frames as the peer's windows and frame size allow.
func (c *conn) sendMessage(st *stream, msg []byte) error {
	frame := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(frame[1:5], uint32(len(msg)))
	frame = append(frame, msg...)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for len(frame) > 0 {
		if st.reset || c.dead {
			return context.Canceled
		}
		if !st.headersSent {
			st.headersSent = true
			c.answers.Add(1)
			if err := c.writeBlockLocked(st.id, okHeaders, false); err != nil {
				c.failLocked(err)
				return err
			}
		}
		n := min(int64(len(frame)), c.sendConn, c.peerInit+st.sendCredit-st.sendUsed, int64(c.maxFrame))
		if n <= 0 {
			c.kickLocked() // what is queued goes out while this waits
			c.windowed.Wait()
			continue
		}
		if err := c.fr.WriteData(st.id, false, frame[:n]); err != nil {
			c.failLocked(err)
			return err
		}
		c.sendConn -= n
		st.sendUsed += n
		frame = frame[n:]
	}
	c.kickLocked()
	return nil
}
