// Package xds is the rate limit service's config client for CONFIG_TYPE=
// GRPC_XDS_SOTW: an ADS state-of-the-world stream to Envoy Gateway's rate limit
// config server (port 18001, node id envoy-ratelimit, mTLS) for resources of
// type RateLimitConfig.
//
// Each response is decoded and handed, whole, to an apply callback. A config
// the callback accepts is ACKed (version_info and nonce of the response); one it
// rejects, or one that cannot be decoded, is NACKed with error_detail set to the
// reason, and the last good config stays in force (the callback never saw the
// bad one, or rejected it without installing it). A broken stream is reopened
// with bounded exponential backoff and jitter until the context is cancelled.
//
// Why not go-control-plane's pkg/client/sotw/v3 (which envoyproxy/ratelimit
// uses): its Response carries only the resources, not version_info, so the
// applied version cannot be reported; InitConnect on a new stream marks the last
// received response as acknowledged, so after a NACK a reconnect claims the bad
// version was accepted; Fetch holds the client's mutex while blocked in Recv;
// and its context is fixed at construction. The loop here is small and keeps the
// protocol state explicit.
//
// A new stream always starts with an empty version_info, so the server sends its
// current snapshot: Envoy Gateway numbers snapshots from 1 again after a
// restart, and resuming with our old version could match a different config.
package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// TypeURL is the resource type the client subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Defaults for Options.
const (
	DefaultNodeID         = "envoy-ratelimit"
	DefaultBackoffInitial = 500 * time.Millisecond
	DefaultBackoffMax     = 30 * time.Second
	// DefaultMaxRecvMsgSize bounds one response; EG's configs for thousands
	// of rules stay far below it.
	DefaultMaxRecvMsgSize = 16 << 20
	// DefaultKeepaliveTime is the quiet time after which the client pings:
	// the shortest a gRPC server allows by default
	// (keepalive.EnforcementPolicy.MinTime in google.golang.org/grpc
	// keepalive/keepalive.go), which Envoy Gateway's rate limit config
	// server keeps (internal/globalratelimit/runner/runner.go builds it with
	// grpc.NewServer and credentials only). Pinging more often would have
	// it close the connection (GOAWAY too_many_pings). Without pings a dead
	// server is noticed only by TCP keepalive, which grpc-go leaves at the
	// OS defaults: two hours on Linux.
	DefaultKeepaliveTime = 5 * time.Minute
	// DefaultKeepaliveTimeout is how long a ping may go unanswered.
	DefaultKeepaliveTimeout = 20 * time.Second
)

// ApplyFunc installs a complete set of configs. It returns an error, without
// installing anything, when the set is invalid; the client then NACKs it.
type ApplyFunc func(ctx context.Context, cfgs []*rlsconfv3.RateLimitConfig) error

// Options configures a Client. Zero values take the defaults.
type Options struct {
	// ServerURL is the xDS server's gRPC target, e.g. "envoy-gateway:18001".
	// Required.
	ServerURL string
	// NodeID identifies this client to the server (CONFIG_GRPC_XDS_NODE_ID).
	// Default DefaultNodeID, the id EG's snapshots are stored under.
	NodeID string
	// NodeMetadata is sent as the node's metadata (string values).
	NodeMetadata map[string]string
	// TLS returns the client TLS configuration; it is called on every connect,
	// so rotated certificate files are picked up. Nil means plaintext.
	TLS func() (*tls.Config, error)
	// Apply receives every decoded response. Required.
	Apply ApplyFunc
	// Rejected, optional, receives the reason of every response NACKed
	// before Apply saw it (a resource that does not decode, or of another
	// type) and of every response too large to receive, so the caller can
	// log and count it as it does the configs Apply rejects.
	Rejected func(err error)
	// BackoffInitial and BackoffMax bound the wait between reconnects: the
	// wait doubles from BackoffInitial up to BackoffMax, with jitter (a random
	// duration in [d/2, d]). It resets once a stream delivers a response.
	BackoffInitial, BackoffMax time.Duration
	// KeepaliveTime and KeepaliveTimeout: after KeepaliveTime without a
	// frame from the server the client pings it, and reconnects when no
	// answer comes within KeepaliveTimeout. Defaults DefaultKeepaliveTime
	// and DefaultKeepaliveTimeout.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// MaxRecvMsgSize bounds one response. Default DefaultMaxRecvMsgSize.
	MaxRecvMsgSize int
	// Logger receives connection and config events. Default slog.Default().
	Logger *slog.Logger
	// Rand returns a float in [0, 1) for jitter. Default math/rand/v2.
	Rand func() float64
	// DialOptions are appended to the client's own (for tests).
	DialOptions []grpc.DialOption
}

// Client keeps an ADS stream open and applies what it receives.
type Client struct {
	o     Options
	node  *corev3.Node
	ready chan struct{}

	mu        sync.Mutex
	version   string // last applied version
	readyOnce sync.Once
	stats     Stats
}

// Stats counts what the client has done, for metrics (Collector) and tests.
type Stats struct {
	// Attempts counts the streams the client tried to open, Connects those
	// it opened, StreamErrors those that failed to open or ended (ctx's end
	// aside); ErrorReasons splits StreamErrors by reason (StreamErrorReasons).
	Attempts, Connects, StreamErrors int
	ErrorReasons                     map[string]int
	// Acks and Nacks count the responses applied and rejected.
	Acks, Nacks int
	// Up reports whether a stream to the server is open now.
	Up bool
	// LastReceived is when the last response arrived, applied or rejected
	// (zero before the first).
	LastReceived time.Time
	// LastNack is the error_detail of the last NACK.
	LastNack string
}

// Reasons a stream failed to open or ended: the values of
// Stats.ErrorReasons' keys and of the reason label of
// ratelimit_config_xds_stream_errors_total.
const (
	// ReasonConnect: no stream could be opened: the server unreachable,
	// the connection or the TLS handshake refused.
	ReasonConnect = "connect"
	// ReasonTLSConfig: the client's TLS files could not be loaded
	// (Options.TLS failed).
	ReasonTLSConfig = "tls_config"
	// ReasonClosed: the server ended the stream (its handler returned, as
	// go-control-plane's does when its server stops).
	ReasonClosed = "closed"
	// ReasonBroken: the stream failed otherwise: the connection lost, a
	// GOAWAY, a keepalive ping unanswered, any other gRPC status.
	ReasonBroken = "broken"
	// ReasonTooLarge: a response over MaxRecvMsgSize ended the stream.
	ReasonTooLarge = "too_large"
)

// StreamErrorReasons lists every reason.
var StreamErrorReasons = []string{ReasonConnect, ReasonTLSConfig, ReasonClosed, ReasonBroken, ReasonTooLarge}

// streamError is an error that ended a stream, with its reason.
type streamError struct {
	reason string
	err    error
}

func (e *streamError) Error() string { return e.err.Error() }
func (e *streamError) Unwrap() error { return e.err }

func ended(reason string, err error) error { return &streamError{reason: reason, err: err} }

// reasonOf is the reason of an error that ended a stream.
func reasonOf(err error) string {
	var se *streamError
	if errors.As(err, &se) {
		return se.reason
	}
	return ReasonBroken
}

// New validates o and returns a client; Run starts it.
func New(o Options) (*Client, error) {
	if o.ServerURL == "" {
		return nil, errors.New("xds: server URL is required (CONFIG_GRPC_XDS_SERVER_URL)")
	}
	if o.Apply == nil {
		return nil, errors.New("xds: an apply callback is required")
	}
	if o.NodeID == "" {
		o.NodeID = DefaultNodeID
	}
	if o.BackoffInitial <= 0 {
		o.BackoffInitial = DefaultBackoffInitial
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	if o.BackoffMax < o.BackoffInitial {
		o.BackoffMax = o.BackoffInitial
	}
	if o.MaxRecvMsgSize <= 0 {
		o.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	if o.KeepaliveTime <= 0 {
		o.KeepaliveTime = DefaultKeepaliveTime
	}
	if o.KeepaliveTimeout <= 0 {
		o.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	node := &corev3.Node{Id: o.NodeID}
	if len(o.NodeMetadata) > 0 {
		fields := make(map[string]*structpb.Value, len(o.NodeMetadata))
		for k, v := range o.NodeMetadata {
			fields[k] = structpb.NewStringValue(v)
		}
		node.Metadata = &structpb.Struct{Fields: fields}
	}
	return &Client{o: o, node: node, ready: make(chan struct{}), stats: Stats{ErrorReasons: map[string]int{}}}, nil
}

// Ready is closed once a first config has been applied.
func (c *Client) Ready() <-chan struct{} { return c.ready }

// WaitReady blocks until a first config has been applied, or ctx ends. Without
// FORCE_START_WITHOUT_INITIAL_CONFIG the service calls it, with a deadline,
// before serving.
func (c *Client) WaitReady(ctx context.Context) error {
	select {
	case <-c.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("xds: no config received from %s: %w", c.o.ServerURL, ctx.Err())
	}
}

// Version returns the version_info of the last applied config ("" before one).
func (c *Client) Version() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

// Stats returns a copy of the client's counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.ErrorReasons = maps.Clone(s.ErrorReasons)
	return s
}

// update changes the stats under the client's lock.
func (c *Client) update(f func(s *Stats)) {
	c.mu.Lock()
	f(&c.stats)
	c.mu.Unlock()
}

// Run connects, streams and reconnects until ctx is cancelled; it then returns
// ctx's error.
func (c *Client) Run(ctx context.Context) error {
	delay := c.o.BackoffInitial
	for {
		healthy, err := c.stream(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if healthy {
			delay = c.o.BackoffInitial
		}
		reason := reasonOf(err)
		c.update(func(s *Stats) { s.StreamErrors++; s.ErrorReasons[reason]++ })
		wait := time.Duration(float64(delay) * (0.5 + 0.5*c.o.Rand()))
		c.o.Logger.Warn("xds stream ended; reconnecting", "server", c.o.ServerURL, "reason", reason, "err", err, "retry_in", wait)
		if err := sleep(ctx, wait); err != nil {
			return err
		}
		delay = min(delay*2, c.o.BackoffMax)
	}
}

// open dials the server and opens an ADS stream on ctx; the caller closes
// the connection.
func (c *Client) open(ctx context.Context) (*grpc.ClientConn, discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, error) {
	creds := insecure.NewCredentials()
	if c.o.TLS != nil {
		tc, err := c.o.TLS()
		if err != nil {
			return nil, nil, ended(ReasonTLSConfig, fmt.Errorf("xds client TLS: %w", err))
		}
		creds = credentials.NewTLS(tc)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.o.MaxRecvMsgSize)),
		// Only while the stream is open: the server's default policy
		// refuses pings without one.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: c.o.KeepaliveTime, Timeout: c.o.KeepaliveTimeout}),
	}, c.o.DialOptions...)
	conn, err := grpc.NewClient(c.o.ServerURL, opts...)
	if err != nil {
		return nil, nil, ended(ReasonConnect, fmt.Errorf("xds dial %s: %w", c.o.ServerURL, err))
	}
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		_ = conn.Close() // the stream's own error is what is reported
		return nil, nil, ended(ReasonConnect, fmt.Errorf("xds open stream to %s: %w", c.o.ServerURL, err))
	}
	return conn, st, nil
}

// stream runs one ADS stream. healthy reports whether it delivered at least
// one response (so the backoff can reset).
func (c *Client) stream(ctx context.Context) (healthy bool, err error) {
	c.update(func(s *Stats) { s.Attempts++ })
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, st, err := c.open(sctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close() }() // the stream's own error is what is reported
	c.update(func(s *Stats) { s.Connects++; s.Up = true })
	defer c.update(func(s *Stats) { s.Up = false })
	// First request of the stream: empty version_info (see the package doc).
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: TypeURL}); err != nil {
		return false, sendErr("subscribe", st, err)
	}
	c.o.Logger.Info("xds stream open", "server", c.o.ServerURL, "node", c.o.NodeID)
	// go-control-plane's server answers a request at once whenever its
	// version_info differs from the snapshot's, so a NACK (which names the last
	// good version) brings the same bad config straight back. The reference
	// service re-parses it in a tight loop; here a resend of the version just
	// rejected is applied again only after a pause that grows with the
	// backoff. It is applied again, not NACKed with the remembered reason:
	// a rejection can depend on more than the resources (a domain also in
	// the CONFIG_DIR files the service merges with them), and the same
	// version may be accepted once that is fixed.
	var nackedVersion, nackReason string
	nackDelay := time.Duration(0)
	for {
		resp, err := st.Recv()
		if err != nil {
			return healthy, c.recvErr(err)
		}
		healthy = true
		c.update(func(s *Stats) { s.LastReceived = time.Now() })
		req := &discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		if nackReason != "" && resp.GetVersionInfo() == nackedVersion {
			nackDelay = min(max(2*nackDelay, c.o.BackoffInitial), c.o.BackoffMax)
			if err := sleep(ctx, nackDelay); err != nil {
				return healthy, err
			}
		} else {
			nackDelay = 0
		}
		reason := c.handle(ctx, resp)
		if reason != "" {
			nackedVersion, nackReason = resp.GetVersionInfo(), reason
			req.VersionInfo = c.Version() // a NACK names the version still in force
			req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: reason}
		} else {
			nackedVersion, nackReason = "", ""
			req.VersionInfo = resp.GetVersionInfo()
		}
		if err := st.Send(req); err != nil {
			return healthy, sendErr("send ack", st, err)
		}
	}
}

// recvErr is the error that ended a stream in Recv. A response over
// MaxRecvMsgSize is dropped by grpc-go, which fails the stream with
// ResourceExhausted: it cannot be NACKed (its nonce was never read), and
// the server sends it again on every stream, so it is reported like a
// rejected config as well.
func (c *Client) recvErr(err error) error {
	if errors.Is(err, io.EOF) {
		return ended(ReasonClosed, errors.New("xds receive: server closed the stream"))
	}
	err = fmt.Errorf("xds receive: %w", err)
	if status.Code(err) != codes.ResourceExhausted {
		return ended(ReasonBroken, err)
	}
	c.o.Logger.Error("xds config too large to receive; keeping the last good config", "kept_version", c.Version(), "max_bytes", c.o.MaxRecvMsgSize, "err", err)
	if c.o.Rejected != nil {
		c.o.Rejected(err)
	}
	return ended(ReasonTooLarge, err)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (c *Client) countNack(reason string) {
	c.update(func(s *Stats) { s.Nacks++; s.LastNack = reason })
}

// sendErr is the error that ended a stream in Send (what: the request),
// with its reason: closed when the server ended the stream, broken
// otherwise.
func sendErr(what string, st grpc.ClientStream, err error) error {
	err = streamErr(st, err)
	reason := ReasonBroken
	if errors.Is(err, io.EOF) {
		reason = ReasonClosed
	}
	return ended(reason, fmt.Errorf("xds %s: %w", what, err))
}

// streamErr returns the stream's real status when Send fails with io.EOF.
func streamErr(st grpc.ClientStream, err error) error {
	if errors.Is(err, io.EOF) {
		if rerr := st.RecvMsg(new(discoveryv3.DiscoveryResponse)); rerr != nil {
			return rerr
		}
	}
	return err
}

// handle decodes and applies one response; it returns the NACK reason, or ""
// when the config was applied.
func (c *Client) handle(ctx context.Context, resp *discoveryv3.DiscoveryResponse) string {
	nack := func(reason string) string {
		c.countNack(reason)
		c.o.Logger.Error("xds config rejected; keeping the last good config", "version", resp.GetVersionInfo(), "kept_version", c.Version(), "reason", reason)
		return reason
	}
	cfgs, err := decode(resp)
	if err != nil {
		if c.o.Rejected != nil {
			c.o.Rejected(fmt.Errorf("xds version %q: %w", resp.GetVersionInfo(), err))
		}
		return nack(err.Error())
	}
	if err := c.o.Apply(ctx, cfgs); err != nil {
		return nack(err.Error())
	}
	c.mu.Lock()
	c.version = resp.GetVersionInfo()
	c.stats.Acks++
	c.mu.Unlock()
	c.readyOnce.Do(func() { close(c.ready) })
	c.o.Logger.Info("xds config applied", "version", resp.GetVersionInfo(), "domains", len(cfgs))
	return ""
}

// decode unpacks a response's resources.
func decode(resp *discoveryv3.DiscoveryResponse) ([]*rlsconfv3.RateLimitConfig, error) {
	if resp.GetTypeUrl() != TypeURL {
		return nil, fmt.Errorf("unexpected type_url %q, want %q", resp.GetTypeUrl(), TypeURL)
	}
	cfgs := make([]*rlsconfv3.RateLimitConfig, 0, len(resp.GetResources()))
	for i, a := range resp.GetResources() {
		if a.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("resource[%d]: unexpected type_url %q", i, a.GetTypeUrl())
		}
		cfg := &rlsconfv3.RateLimitConfig{}
		if err := proto.Unmarshal(a.GetValue(), cfg); err != nil {
			return nil, fmt.Errorf("resource[%d]: decode RateLimitConfig: %w", i, err)
		}
		cfgs = append(cfgs, cfg)
	}
	return cfgs, nil
}
