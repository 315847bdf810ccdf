// Package unarygrpc serves unary gRPC methods over HTTP/2 with less work per
// call than grpc-go's server transport.
//
// The rate limit service answers one unary method, ShouldRateLimit, tens of
// thousands of times a second; in its CPU profile grpc-go's server transport
// (per-stream contexts, metadata maps, the loopy writer's control queue,
// stream bookkeeping for features a unary call never uses) was about half of
// the service's CPU per decision. This package keeps what a unary call needs
// and nothing else: x/net's HTTP/2 framer and HPACK decoder read the frames,
// a call's request message is handed to its method's Handler on a reusable
// worker goroutine (or, for an AsyncHandler, started on the read loop and
// answered by whichever goroutine has the answer), and the answer goes out
// as pre-encoded HEADERS, one DATA frame and the trailers, coalesced with
// other answers into one write.
//
// What it implements: the HTTP/2 connection preface and SETTINGS exchange,
// flow control in both directions (large static receive windows, the peer's
// windows honoured on send, answers that do not fit wait for WINDOW_UPDATE),
// PING, RST_STREAM (cancels the call's context), GOAWAY in both directions
// (graceful stop and MaxConnectionAge), MAX_CONCURRENT_STREAMS (a stream
// counts until its handler returns, so resetting streams cannot pile up
// work: the HTTP/2 "rapid reset" attack), a header list size limit, a
// control-frame rate limit, gRPC length-prefixed messages up to
// MaxRecvMsgSize, grpc-status and percent-encoded grpc-message trailers, and
// TLS (ALPN h2), server-streaming methods (HandleServerStream: the health
// service's Watch), frames bounded by the 16,384-byte SETTINGS_MAX_FRAME_SIZE
// it advertises, and gzip (requests decompressed up to MaxRecvMsgSize,
// answers compressed for a client that compresses, grpc-accept-encoding
// advertised, other encodings refused with Unimplemented as grpc-go does).
// What it does not: client streaming and the grpc-timeout deadline, which
// is parsed and validated but not turned into a context deadline: the rate
// limit engine bounds every call by its own store timeout, shorter than
// Envoy Gateway's, and a client that gives up resets the stream, which
// cancels the call.
package unarygrpc

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Handler answers one call. It appends the response message to dst and
// returns the result, or returns an error; a google.golang.org/grpc/status
// error keeps its code and message, any other error is sent as Unknown.
// ctx is canceled when the client resets the stream or the connection
// closes. req is only valid until Handler returns.
type Handler func(ctx context.Context, req []byte, dst []byte) ([]byte, error)

// AsyncHandler starts one call and returns without waiting for its answer:
// the call is answered by reply.Respond, exactly once, from any goroutine,
// possibly before AsyncHandler returns. It runs on the connection's read
// loop (no goroutine hand-off per call), so it must not block. ctx is as
// for Handler; req is only valid until AsyncHandler returns or reply is
// called, whichever comes first.
type AsyncHandler func(ctx context.Context, req []byte, reply Reply)

// Reply answers an asynchronous call (HandleAsync).
type Reply interface {
	// Buffer returns the buffer to append the response message to, for
	// Respond; call it once.
	Buffer() []byte
	// Respond answers the call: out is Buffer() with the response message
	// appended, or err is the call's error (as a Handler's).
	Respond(out []byte, err error)
}

// Defaults for Options.
const (
	DefaultMaxRecvMsgSize       = 4 << 20 // grpc-go's default
	DefaultMaxConcurrentStreams = 1024
	DefaultMaxHeaderListSize    = 16 << 10
	// DefaultMaxHeldBytes bounds the request bytes one connection's streams
	// hold at once (bodies being received and requests being handled).
	DefaultMaxHeldBytes = 64 << 20
	// DefaultControlFramesPerSecond bounds PING and SETTINGS frames a peer
	// may send (each makes the server write an ACK).
	DefaultControlFramesPerSecond = 100
	// streamWindow and connWindow are the receive windows advertised: a
	// request is a few hundred bytes, so WINDOW_UPDATEs are rare.
	streamWindow = 1 << 20
	connWindow   = 1 << 24
	// handshakeTimeout bounds the TLS handshake and the client preface.
	handshakeTimeout = 10 * time.Second
	// writeTimeout bounds one flush to a peer that stopped reading.
	writeTimeout = 10 * time.Second
)

// Options configure a Server. The zero value serves plaintext HTTP/2
// (h2c with prior knowledge, as gRPC clients speak it) with the defaults.
type Options struct {
	// TLS, when non-nil, serves TLS with this config; "h2" is added to its
	// NextProtos.
	TLS *tls.Config
	// MaxConnectionAge, when > 0, sends GOAWAY to a connection this old so
	// clients spread over replicas; MaxConnectionAgeGrace later it is closed.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// MaxRecvMsgSize bounds a request message; larger ones are answered
	// with ResourceExhausted. Default DefaultMaxRecvMsgSize.
	MaxRecvMsgSize int
	// MaxConcurrentStreams per connection, advertised in SETTINGS; a stream
	// over it is refused (REFUSED_STREAM, safe for the client to retry).
	// Default DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
	// MaxHeaderListSize bounds a request's headers. Default DefaultMaxHeaderListSize.
	MaxHeaderListSize uint32
	// MaxHeldBytes bounds the request bytes one connection's streams hold at
	// once; a stream whose DATA would go over it is answered with
	// ResourceExhausted. Default DefaultMaxHeldBytes.
	MaxHeldBytes int64
	// ControlFramesPerSecond bounds PING and SETTINGS frames per connection;
	// a peer over it gets GOAWAY ENHANCE_YOUR_CALM. Default DefaultControlFramesPerSecond.
	ControlFramesPerSecond int
	// Workers > 0 keeps that many goroutines to run handlers on (no
	// goroutine start and stack growth per call); a call that finds them
	// all busy runs on a new goroutine. 0 starts a goroutine per call.
	Workers int
	// MaxConnections > 0 caps the connections open at once; one accepted
	// over it is closed at once, counted (Stats.Refused) and logged at most
	// once per RefusalLogInterval. 0: no cap (the service's default is a
	// cap: GRPC_MAX_CONNECTIONS, internal/ratelimit/settings).
	MaxConnections int
	// IdleTimeout > 0 sends GOAWAY to, and closes, a connection that has
	// had no call in flight for that long (an idle client holds a file
	// descriptor and its buffers). 0: never.
	IdleTimeout time.Duration
	Logger      *slog.Logger
}

// RefusalLogInterval is the least time between two log lines about
// connections refused at MaxConnections: a fleet over the cap retries
// every second or so, and a line per connection would flood the log.
const RefusalLogInterval = 10 * time.Second

// RefusalLog logs connections refused at a cap at most once per
// RefusalLogInterval, with how many were refused since its last line (each
// is counted in Stats.Refused). The zero value is ready; safe for
// concurrent use.
type RefusalLog struct {
	mu   sync.Mutex
	last time.Time
	n    uint64
}

// Refused notes one connection refused at maxConns (total: refused since
// start) and logs if the last line is older than RefusalLogInterval.
func (r *RefusalLog) Refused(log *slog.Logger, maxConns int, total uint64) {
	now := time.Now()
	r.mu.Lock()
	r.n++
	if !r.last.IsZero() && now.Sub(r.last) < RefusalLogInterval {
		r.mu.Unlock()
		return
	}
	n := r.n
	r.n, r.last = 0, now
	r.mu.Unlock()
	log.Warn("grpc: connections refused at GRPC_MAX_CONNECTIONS; clients retry, usually on another replica",
		"max_connections", maxConns, "refused", n, "refused_total", total, "next_line_after", RefusalLogInterval.String())
}

// ErrServerStopped is returned by Serve after Stop or GracefulStop.
var ErrServerStopped = errors.New("unarygrpc: server stopped")

// Server serves registered methods. Create with New, register with Handle,
// then Serve.
type Server struct {
	o       Options
	log     *slog.Logger
	methods map[string]Handler
	async   map[string]AsyncHandler
	streams map[string]ServerStreamHandler
	work    chan *stream

	mu       sync.Mutex
	lis      map[net.Listener]struct{}
	conns    map[*conn]struct{}
	stopping bool
	connWG   sync.WaitGroup
	workers  sync.WaitGroup
	quit     chan struct{}

	accepted, connsRefused, idleClosed, acceptErrors atomic.Uint64
	refusedLog                                       RefusalLog
}

// New returns a server with no methods.
func New(o Options) *Server {
	if o.MaxRecvMsgSize <= 0 {
		o.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if o.MaxHeaderListSize == 0 {
		o.MaxHeaderListSize = DefaultMaxHeaderListSize
	}
	if o.MaxHeldBytes <= 0 {
		o.MaxHeldBytes = DefaultMaxHeldBytes
	}
	if o.ControlFramesPerSecond <= 0 {
		o.ControlFramesPerSecond = DefaultControlFramesPerSecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.TLS != nil {
		o.TLS = withH2(o.TLS)
		if get := o.TLS.GetConfigForClient; get != nil {
			// Configs made per handshake (certificate rotation) need h2 too,
			// or clients that enforce ALPN (grpc-go >= 1.67) refuse them.
			o.TLS.GetConfigForClient = func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
				c, err := get(hi)
				if c == nil || err != nil {
					return c, err
				}
				return withH2(c), nil
			}
		}
	}
	s := &Server{
		o:       o,
		log:     o.Logger,
		methods: map[string]Handler{},
		async:   map[string]AsyncHandler{},
		streams: map[string]ServerStreamHandler{},
		lis:     map[net.Listener]struct{}{},
		conns:   map[*conn]struct{}{},
		quit:    make(chan struct{}),
	}
	if o.Workers > 0 {
		s.work = make(chan *stream)
		for i := 0; i < o.Workers; i++ {
			s.workers.Add(1)
			go s.worker()
		}
	}
	return s
}

// withH2 returns a copy of c that offers ALPN "h2".
func withH2(c *tls.Config) *tls.Config {
	c = c.Clone()
	if !contains(c.NextProtos, "h2") {
		c.NextProtos = append([]string{"h2"}, c.NextProtos...)
	}
	return c
}

func contains(l []string, s string) bool {
	for _, v := range l {
		if v == s {
			return true
		}
	}
	return false
}

// Handle registers h for the full method name "/package.Service/Method".
// Call it before Serve.
func (s *Server) Handle(fullMethod string, h Handler) {
	s.methods[fullMethod] = h
}

// HandleAsync registers h for the full method name "/package.Service/Method".
// Call it before Serve.
func (s *Server) HandleAsync(fullMethod string, h AsyncHandler) {
	s.async[fullMethod] = h
}

func (s *Server) worker() {
	defer s.workers.Done()
	for {
		select {
		case st := <-s.work:
			st.c.run(st)
		case <-s.quit:
			return
		}
	}
}

// dispatch runs a call on an idle worker, or on a new goroutine.
func (s *Server) dispatch(st *stream) {
	if s.work != nil {
		select {
		case s.work <- st:
			return
		default:
		}
	}
	go st.c.run(st)
}

// Serve accepts connections on l until Stop or GracefulStop, then returns
// ErrServerStopped; another accept error is returned as is.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		_ = l.Close() // refused listener; ErrServerStopped is the answer
		return ErrServerStopped
	}
	s.lis[l] = struct{}{}
	s.mu.Unlock()
	var delay time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			stopping := s.stopping
			s.mu.Unlock()
			if stopping {
				return ErrServerStopped
			}
			if temporaryAcceptError(err) {
				// Out of file descriptors and the like: back off and keep
				// accepting, as net/http does (returning here ended the
				// process under fd exhaustion).
				s.acceptErrors.Add(1)
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.log.Warn("grpc: accept failed; retrying", "err", err, "delay", delay)
				select {
				case <-time.After(delay):
				case <-s.quit:
				}
				continue
			}
			return err
		}
		delay = 0
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			_ = nc.Close() // refused: server stopping
			return ErrServerStopped
		}
		if s.o.MaxConnections > 0 && len(s.conns) >= s.o.MaxConnections {
			// Over the cap: close at once (a client retries with backoff,
			// usually on another replica) rather than hold a descriptor.
			s.mu.Unlock()
			s.refusedLog.Refused(s.log, s.o.MaxConnections, s.connsRefused.Add(1))
			_ = nc.Close() // refused: over MaxConnections, counted above
			continue
		}
		s.accepted.Add(1)
		c := s.newConn(nc)
		s.conns[c] = struct{}{}
		s.connWG.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// temporaryAcceptError reports an accept error worth retrying: out of file
// descriptors or memory, a connection aborted before it was accepted, or a
// timeout. net.Error's Temporary is deprecated for reads and writes, not for
// accept, where net/http still relies on it.
func temporaryAcceptError(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	var t interface{ Temporary() bool }
	if errors.As(err, &t) && t.Temporary() {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Stats are a server's connection counts, for metrics.
type Stats struct {
	Max          int    // the cap on open connections (MaxConnections); 0: none
	Open         int    // connections open now
	Accepted     uint64 // connections accepted since start
	Refused      uint64 // connections closed at accept: MaxConnections reached
	IdleClosed   uint64 // connections closed after IdleTimeout without a call
	AcceptErrors uint64 // temporary accept errors retried (EMFILE and the like)
}

// Stats returns the connection counts.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	open := len(s.conns)
	s.mu.Unlock()
	return Stats{Max: max(s.o.MaxConnections, 0), Open: open, Accepted: s.accepted.Load(), Refused: s.connsRefused.Load(),
		IdleClosed: s.idleClosed.Load(), AcceptErrors: s.acceptErrors.Load()}
}

func (s *Server) closeListeners() {
	for l := range s.lis {
		_ = l.Close() // stopping: Serve returns on its own
	}
	clear(s.lis)
}

// GracefulStop stops accepting, sends GOAWAY to every connection, waits for
// the calls in flight to be answered, and closes the connections.
func (s *Server) GracefulStop() {
	s.mu.Lock()
	s.stopping = true
	s.closeListeners()
	for c := range s.conns {
		c.goAway(errCodeNo)
	}
	s.mu.Unlock()
	s.connWG.Wait()
	s.stopWorkers()
}

// Stop closes every listener and connection at once; calls in flight are
// canceled.
func (s *Server) Stop() {
	s.mu.Lock()
	s.stopping = true
	s.closeListeners()
	for c := range s.conns {
		c.close()
	}
	s.mu.Unlock()
	s.connWG.Wait()
	s.stopWorkers()
}

func (s *Server) stopWorkers() {
	s.mu.Lock()
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	s.mu.Unlock()
	s.workers.Wait()
}

func (s *Server) removeConn(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.connWG.Done()
}

// handshake runs TLS (if configured) and reads the client preface.
func (s *Server) handshake(nc net.Conn) (net.Conn, *bufio.Reader, error) {
	_ = nc.SetDeadline(time.Now().Add(handshakeTimeout))
	if s.o.TLS != nil {
		tc := tls.Server(nc, s.o.TLS)
		if err := tc.Handshake(); err != nil {
			return nil, nil, fmt.Errorf("tls handshake: %w", err)
		}
		if p := tc.ConnectionState().NegotiatedProtocol; p != "" && p != "h2" {
			return nil, nil, fmt.Errorf("tls: client negotiated %q, not h2", p)
		}
		nc = tc
	}
	br := bufio.NewReaderSize(nc, 32<<10)
	preface := make([]byte, len(clientPreface))
	if _, err := io.ReadFull(br, preface); err != nil {
		return nil, nil, fmt.Errorf("read client preface: %w", err)
	}
	if string(preface) != clientPreface {
		return nil, nil, errors.New("not an HTTP/2 client preface (gRPC needs HTTP/2 with prior knowledge)")
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, br, nil
}

const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
