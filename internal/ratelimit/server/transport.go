package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	_ "google.golang.org/grpc/encoding/gzip" // grpc-go's server then accepts and answers gzip, as the lean one
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"

	"github.com/budgetgen/budgetgen/internal/ratelimit/unarygrpc"
)

// Transports for the gRPC port (Options.Transport, GRPC_SERVER_IMPL).
const (
	// TransportLean is unarygrpc: about half the CPU per call of grpc-go's
	// server (docs/benchmarks.md). The default.
	TransportLean = "lean"
	// TransportGRPCGo is grpc-go's server, the one the reference runs: for
	// an operator who meets an HTTP/2 interoperability problem in
	// production and wants to switch without a new image.
	TransportGRPCGo = "grpc-go"
)

// Transports lists the valid Options.Transport values.
var Transports = []string{TransportLean, TransportGRPCGo}

// grpcTransport is what Serve needs from either gRPC server.
type grpcTransport interface {
	Serve(net.Listener) error
	GracefulStop()
	Stop()
	Stats() unarygrpc.Stats
}

// leanTransport is unarygrpc's server.
type leanTransport struct{ *unarygrpc.Server }

func (s *Server) newLean(o Options) grpcTransport {
	g := unarygrpc.New(unarygrpc.Options{
		TLS:                   o.TLS,
		MaxConnectionAge:      o.MaxConnectionAge,
		MaxConnectionAgeGrace: o.MaxConnectionAgeGrace,
		MaxConnections:        o.MaxConnections,
		IdleTimeout:           o.IdleTimeout,
		Workers:               o.StreamWorkers,
		Logger:                o.Logger,
	})
	if a, ok := s.d.(asyncDecider); ok {
		g.HandleAsync(methodShouldRateLimit, s.startShouldRateLimit(a))
	} else {
		g.Handle(methodShouldRateLimit, s.serveShouldRateLimit)
	}
	g.Handle(methodHealthCheck, s.health.serveHealthCheck)
	g.HandleServerStream(methodHealthWatch, s.health.serveHealthWatch)
	return leanTransport{g}
}

// goTransport is grpc-go's server behind a listener that caps and counts
// connections (grpc-go itself retries temporary accept errors).
type goTransport struct {
	*grpc.Server
	max     int
	log     *slog.Logger
	refused unarygrpc.RefusalLog
	stats   connStats
}

type connStats struct {
	open                            atomic.Int64
	accepted, refused, acceptErrors atomic.Uint64
}

func (t *goTransport) Stats() unarygrpc.Stats {
	return unarygrpc.Stats{Max: max(t.max, 0), Open: int(t.stats.open.Load()), Accepted: t.stats.accepted.Load(),
		Refused: t.stats.refused.Load(), AcceptErrors: t.stats.acceptErrors.Load()}
}

func (t *goTransport) Serve(l net.Listener) error {
	return t.Server.Serve(&countingListener{Listener: l, t: t})
}

// countingListener closes connections over the cap at once, as unarygrpc
// does, and counts them.
type countingListener struct {
	net.Listener
	t *goTransport
}

func (l *countingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			l.t.stats.acceptErrors.Add(1) // grpc-go retries the temporary ones
			return nil, err
		}
		if l.t.max > 0 && l.t.stats.open.Load() >= int64(l.t.max) {
			l.t.refused.Refused(l.t.log, l.t.max, l.t.stats.refused.Add(1))
			_ = c.Close()
			continue
		}
		l.t.stats.accepted.Add(1)
		l.t.stats.open.Add(1)
		return &countedConn{Conn: c, open: &l.t.stats.open}, nil
	}
}

type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

func (s *Server) newGRPCGo(o Options) grpcTransport {
	opts := []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      o.MaxConnectionAge,
			MaxConnectionAgeGrace: o.MaxConnectionAgeGrace,
			MaxConnectionIdle:     o.IdleTimeout, // 0: grpc-go's default, never
		}),
		// Keepalive PINGs without calls are allowed, as on the lean
		// transport (grpc-go's default policy sends GOAWAY to a client that
		// pings more often than every 5 minutes without a call).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(unarygrpc.DefaultMaxConcurrentStreams),
	}
	if o.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(o.TLS)))
	}
	if o.StreamWorkers > 0 {
		opts = append(opts, grpc.NumStreamWorkers(uint32(o.StreamWorkers)))
	}
	// The wire bytes go to the same handler as on the lean transport (our
	// decoder and encoder): both answer every request alike, a malformed
	// one with InvalidArgument (grpc-go's proto codec would say Internal).
	opts = append(opts, grpc.ForceServerCodec(rawOrProto{}))
	g := grpc.NewServer(opts...)
	g.RegisterService(&rateLimitServiceDesc, s)
	healthpb.RegisterHealthServer(g, healthService{s.health})
	return &goTransport{Server: g, max: o.MaxConnections, log: o.Logger}
}

// rateLimitServiceDesc is RateLimitService with raw messages: the handler
// is serveShouldRateLimit, as on the lean transport.
var rateLimitServiceDesc = grpc.ServiceDesc{
	ServiceName: "envoy.service.ratelimit.v3.RateLimitService",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "ShouldRateLimit",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var in rawMessage
			if err := dec(&in); err != nil {
				return nil, err
			}
			out, err := srv.(*Server).serveShouldRateLimit(ctx, in, nil)
			if err != nil {
				return nil, err
			}
			return (*rawMessage)(&out), nil
		},
	}},
	Metadata: "envoy/service/ratelimit/v3/rls.proto",
}

var _ = rlpb.RateLimitService_ShouldRateLimit_FullMethodName // the service above is this one

// rawMessage is a message's wire bytes, passed through by rawOrProto.
type rawMessage []byte

// rawOrProto is grpc-go's codec for the grpc-go transport: raw messages
// as they are, anything else (health) as protobuf.
type rawOrProto struct{}

func (rawOrProto) Name() string { return "proto" }

func (rawOrProto) Marshal(v any) ([]byte, error) {
	if m, ok := v.(*rawMessage); ok {
		return *m, nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal %T: not a protobuf message", v)
	}
	return proto.Marshal(m)
}

func (rawOrProto) Unmarshal(data []byte, v any) error {
	if m, ok := v.(*rawMessage); ok {
		*m = append((*m)[:0], data...) // grpc-go reuses data
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("unmarshal %T: not a protobuf message", v)
	}
	return proto.Unmarshal(data, m)
}

// healthService is the lean transport's health handlers behind grpc-go's
// interface, so both transports answer Check and Watch the same way.
type healthService struct {
	h *Health
}

func (h healthService) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	in, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	out, err := h.h.serveHealthCheck(ctx, in, nil)
	if err != nil {
		return nil, err
	}
	var resp healthpb.HealthCheckResponse
	if err := proto.Unmarshal(out, &resp); err != nil {
		return nil, fmt.Errorf("health check answer: %w", err)
	}
	return &resp, nil
}

func (h healthService) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	in, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	return h.h.serveHealthWatch(stream.Context(), in, func(msg []byte) error {
		var resp healthpb.HealthCheckResponse
		if err := proto.Unmarshal(msg, &resp); err != nil {
			return err
		}
		return stream.Send(&resp)
	})
}

func (h healthService) List(context.Context, *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if h.h.Healthy() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	return &healthpb.HealthListResponse{Statuses: map[string]*healthpb.HealthCheckResponse{
		"": {Status: st}, HealthServiceName: {Status: st},
	}}, nil
}

// registerConnMetrics exports the gRPC port's connection counts.
func registerConnMetrics(reg prometheus.Registerer, t grpcTransport) error {
	for _, m := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ratelimit_grpc_connections_open", Help: "gRPC connections open now."},
			func() float64 { return float64(t.Stats().Open) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ratelimit_grpc_max_connections", Help: "The cap on open gRPC connections (GRPC_MAX_CONNECTIONS; 0: none): past it, connections are closed at accept."},
			func() float64 { return float64(t.Stats().Max) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ratelimit_grpc_connections_accepted_total", Help: "gRPC connections accepted."},
			func() float64 { return float64(t.Stats().Accepted) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ratelimit_grpc_connections_refused_total", Help: "gRPC connections closed at accept: GRPC_MAX_CONNECTIONS reached (logged at most once per 10 s)."},
			func() float64 { return float64(t.Stats().Refused) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ratelimit_grpc_connections_idle_closed_total", Help: "gRPC connections closed after GRPC_IDLE_TIMEOUT without a call (lean transport)."},
			func() float64 { return float64(t.Stats().IdleClosed) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ratelimit_grpc_accept_errors_total", Help: "gRPC accept errors (EMFILE and the like), retried with backoff."},
			func() float64 { return float64(t.Stats().AcceptErrors) }),
	} {
		if err := reg.Register(m); err != nil {
			return fmt.Errorf("register gRPC connection metrics: %w", err)
		}
	}
	return nil
}
