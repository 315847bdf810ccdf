// Package server exposes the decision engine the way envoyproxy/ratelimit
// does: gRPC RateLimitService v3 and gRPC health on the gRPC port, HTTP
// /healthcheck and /json on the HTTP port, /rlconfig, pprof and /metrics on
// the debug port, and Prometheus metrics on their own address when asked.
package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sort"
	"strings"
	"sync"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/unarygrpc"
)

// Decider is what the server needs from the engine.
type Decider interface {
	ShouldRateLimit(ctx context.Context, req *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error)
	Config() *config.Config
}

// limiter is a Decider that says what request shape it accepts
// (engine.Engine): the decoder stops building a request past it.
type limiter interface {
	Limits() decide.Limits
}

// Defaults for Options.
const (
	DefaultMaxConnectionAge      = 24 * time.Hour
	DefaultMaxConnectionAgeGrace = time.Hour
	DefaultMetricsPath           = "/metrics"
	// DefaultMaxJSONBody bounds a /json request body.
	DefaultMaxJSONBody = 4 << 20
	// DefaultHTTPIdleTimeout closes idle HTTP keep-alive connections when
	// Options.IdleTimeout is 0 (net/http keeps them forever).
	DefaultHTTPIdleTimeout = 2 * time.Minute
	// HealthServiceName is the gRPC health service name the reference uses.
	HealthServiceName = "ratelimit"
)

// Options configure a Server. Addresses are host:port; ":0" picks a free port
// (see Addrs). An empty HTTP, debug or metrics address disables that listener;
// the gRPC address is required.
type Options struct {
	GRPCAddr  string
	HTTPAddr  string
	DebugAddr string
	// MetricsAddr serves Prometheus metrics at MetricsPath (PROMETHEUS_ADDR
	// when USE_PROMETHEUS); the debug port always serves /metrics too.
	MetricsAddr string
	MetricsPath string // default DefaultMetricsPath
	// TLS, when non-nil, serves gRPC over TLS with this config (nil = plaintext).
	TLS *tls.Config
	// DisableJSON leaves /json off the HTTP port (only /healthcheck
	// answers); the reference always serves it. The service turns it off
	// when the gRPC port requires client certificates (HTTP_JSON).
	DisableJSON bool
	// HTTPTLS, when non-nil, serves the HTTP port over TLS with this config:
	// /json then answers only requests whose client certificate was verified
	// (403 otherwise), while /healthcheck answers everyone, including probes
	// that present no certificate. Use a config that verifies a certificate
	// if one is given (OptionalClientCert).
	HTTPTLS *tls.Config
	// Gatherer for /metrics; default prometheus.DefaultGatherer.
	Gatherer prometheus.Gatherer
	// MaxConnectionAge and MaxConnectionAgeGrace are the reference's
	// GRPC_MAX_CONNECTION_AGE(_GRACE); defaults 24h and 1h.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
	// StreamWorkers > 0 serves calls on that many reusable goroutines; 0
	// starts one goroutine per call. On the lean transport an uncompressed
	// ShouldRateLimit call with an asyncDecider starts on its connection's
	// read loop instead.
	StreamWorkers int
	// Transport is the gRPC server: TransportLean (default) or
	// TransportGRPCGo.
	Transport string
	// MaxConnections > 0 caps the gRPC port's open connections (one over
	// it is closed at accept); 0: no cap.
	MaxConnections int
	// IdleTimeout > 0 closes (GOAWAY first) gRPC connections without a call
	// for that long, and HTTP keep-alive connections idle that long on the
	// HTTP, debug and metrics ports (default DefaultHTTPIdleTimeout there).
	IdleTimeout time.Duration
	// Registerer, when set, gets the gRPC connection metrics.
	Registerer prometheus.Registerer
	// RequireConfigForHealth makes health fail until a config is loaded
	// (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
	RequireConfigForHealth bool
	// Ledger, when set, is served read-only on the debug port under /ledger/
	// for `budgetgen report --service` (the embedded store's ledger, which
	// lives in this process). It names principals: keep the debug port
	// private, as its pprof endpoints already require.
	Ledger ledger.Reader
	Logger *slog.Logger
}

// Server owns the listeners. Create with New, run with Serve.
type Server struct {
	d      Decider
	shape  shape // the decoder's bounds: d's Limits, or none
	o      Options
	log    *slog.Logger
	grpc   grpcTransport
	health *Health

	grpcL, httpL, debugL, metricsL net.Listener
	httpS, debugS, metricsS        *http.Server
}

// New opens the listeners (so bad addresses fail here) and builds the servers.
func New(d Decider, o Options) (*Server, error) {
	if o.GRPCAddr == "" {
		return nil, errors.New("server: a gRPC address is required")
	}
	o = o.withDefaults()
	s := &Server{d: d, o: o, log: o.Logger}
	if l, ok := d.(limiter); ok {
		lim := l.Limits()
		s.shape = shape{descriptors: lim.MaxDescriptors, entries: lim.MaxEntries}
	}
	s.health = newHealth(o.RequireConfigForHealth)
	// The gRPC port serves two unary methods; unarygrpc does that with
	// about half the CPU per call of grpc-go's server (docs/benchmarks.md).
	switch o.Transport {
	case "", TransportLean:
		s.grpc = s.newLean(o)
	case TransportGRPCGo:
		s.grpc = s.newGRPCGo(o)
	default:
		return nil, fmt.Errorf("server: unknown gRPC transport %q (want one of %s)", o.Transport, strings.Join(Transports, ", "))
	}
	if o.Registerer != nil {
		if err := registerConnMetrics(o.Registerer, s.grpc); err != nil {
			return nil, err
		}
	}
	if err := s.listen(); err != nil {
		return nil, err
	}
	s.httpServers()
	return s, nil
}

// withDefaults fills the zero values of o with the defaults.
func (o Options) withDefaults() Options {
	if o.MetricsPath == "" {
		o.MetricsPath = DefaultMetricsPath
	}
	if o.Gatherer == nil {
		o.Gatherer = prometheus.DefaultGatherer
	}
	if o.MaxConnectionAge <= 0 {
		o.MaxConnectionAge = DefaultMaxConnectionAge
	}
	if o.MaxConnectionAgeGrace <= 0 {
		o.MaxConnectionAgeGrace = DefaultMaxConnectionAgeGrace
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// listen opens every configured listener, or none: on an error those
// already open are closed.
func (s *Server) listen() error {
	var err error
	listen := func(addr string) net.Listener {
		if err != nil || addr == "" {
			return nil
		}
		var l net.Listener
		l, err = net.Listen("tcp", addr)
		if err != nil {
			err = fmt.Errorf("listen %s: %w", addr, err)
		}
		return l
	}
	s.grpcL = listen(s.o.GRPCAddr)
	s.httpL = listen(s.o.HTTPAddr)
	s.debugL = listen(s.o.DebugAddr)
	s.metricsL = listen(s.o.MetricsAddr)
	if err != nil {
		s.closeListeners()
	}
	return err
}

// httpServers builds the HTTP servers of the open HTTP listeners: the HTTP
// port (/healthcheck, /json), the debug port and the metrics port.
func (s *Server) httpServers() {
	o := s.o
	httpIdle := o.IdleTimeout
	if httpIdle <= 0 {
		httpIdle = DefaultHTTPIdleTimeout
	}
	metricsH := promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{})
	if s.httpL != nil {
		mux := http.NewServeMux()
		mux.Handle("/healthcheck", s.health)
		if !o.DisableJSON {
			mux.HandleFunc("/json", s.serveJSON)
		}
		if o.HTTPTLS != nil {
			s.httpL = tls.NewListener(s.httpL, o.HTTPTLS)
		}
		s.httpS = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: httpIdle}
	}
	if s.debugL != nil {
		s.debugS = &http.Server{Handler: s.debugMux(metricsH), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: httpIdle}
	}
	if s.metricsL != nil {
		mux := http.NewServeMux()
		mux.Handle(o.MetricsPath, metricsH)
		s.metricsS = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: httpIdle}
	}
}

func (s *Server) closeListeners() {
	for _, l := range []net.Listener{s.grpcL, s.httpL, s.debugL, s.metricsL} {
		if l != nil {
			_ = l.Close()
		}
	}
}

// Addrs returns the bound addresses (nil for disabled listeners).
func (s *Server) Addrs() (grpcAddr, httpAddr, debugAddr, metricsAddr net.Addr) {
	a := func(l net.Listener) net.Addr {
		if l == nil {
			return nil
		}
		return l.Addr()
	}
	return a(s.grpcL), a(s.httpL), a(s.debugL), a(s.metricsL)
}

// GRPCStats returns the gRPC port's connection counts.
func (s *Server) GRPCStats() unarygrpc.Stats { return s.grpc.Stats() }

// Health returns the health checker (the config source marks config loads,
// shutdown marks draining).
func (s *Server) Health() *Health { return s.health }

// Serve serves until ctx is done, then fails health, stops accepting and
// drains in-flight gRPC calls (up to drain), and returns. A listener error
// ends it early with that error. It is ServeStop with no delay.
func (s *Server) Serve(ctx context.Context, drain time.Duration) error {
	return s.ServeStop(ctx, Stop{Drain: drain})
}

// Stop is how ServeStop stops once its context is done.
type Stop struct {
	// Delay keeps every listener accepting and serving, health failing, for
	// this long before they close: the time a terminating pod's removal
	// from the Service's endpoints takes to reach its callers (SHUTDOWN_DELAY).
	// 0: close at once.
	Delay time.Duration
	// Skip, when closed, ends the delay early (a second SIGTERM or SIGINT).
	// nil: the delay runs in full.
	Skip <-chan struct{}
	// Drain bounds how long in-flight gRPC calls may finish once the
	// listeners are closed; 0 = 5s.
	Drain time.Duration
}

// ServeStop serves until ctx is done, then fails health (readiness) and
// keeps serving for st.Delay (unless st.Skip closes or a listener fails),
// then stops accepting, drains in-flight gRPC calls (up to st.Drain) and
// returns. A listener error ends it early with that error.
func (s *Server) ServeStop(ctx context.Context, st Stop) error {
	errc := make(chan error, 4)
	var wg sync.WaitGroup
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, unarygrpc.ErrServerStopped) && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- fmt.Errorf("%s server: %w", name, err)
			}
		}()
	}
	run("grpc", func() error { return s.grpc.Serve(s.grpcL) })
	if s.httpS != nil {
		run("http", func() error { return s.httpS.Serve(s.httpL) })
	}
	if s.debugS != nil {
		run("debug", func() error { return s.debugS.Serve(s.debugL) })
	}
	if s.metricsS != nil {
		run("metrics", func() error { return s.metricsS.Serve(s.metricsL) })
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	s.health.Fail(ComponentShutdown)
	s.health.endWatches() // after NOT_SERVING: Watch streams end, the stop need not wait for them
	if err == nil {
		err = s.delayStop(st, errc)
	}
	s.closeAndDrain(st.Drain)
	wg.Wait()
	return err
}

// delayStop keeps serving, health failing, for st.Delay, or until st.Skip
// closes or a listener fails (that error is returned).
func (s *Server) delayStop(st Stop, errc <-chan error) error {
	if st.Delay <= 0 {
		return nil
	}
	t := time.NewTimer(st.Delay)
	defer t.Stop()
	select {
	case <-t.C:
		s.log.Info("shutdown delay over: closing the listeners", "shutdown_delay", st.Delay.String())
	case <-st.Skip:
		s.log.Info("shutdown delay skipped (second signal): closing the listeners")
	case err := <-errc:
		return err
	}
	return nil
}

// closeAndDrain stops accepting on every listener, lets in-flight gRPC
// calls finish for up to drain (then cuts them), and shuts the HTTP servers
// down.
func (s *Server) closeAndDrain(drain time.Duration) {
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	if drain <= 0 {
		drain = 5 * time.Second
	}
	select {
	case <-stopped:
	case <-time.After(drain):
		s.grpc.Stop()
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, h := range []*http.Server{s.httpS, s.debugS, s.metricsS} {
		if h != nil {
			_ = h.Shutdown(sctx)
		}
	}
}

// serveJSON is the reference's /json: a proto-JSON RateLimitRequest in, the
// proto-JSON response out; 200 OK, 429 OVER_LIMIT, 500 UNKNOWN, 400 for a
// bad body or a request the service rejects.
func (s *Server) serveJSON(w http.ResponseWriter, r *http.Request) {
	if s.o.HTTPTLS != nil && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
		// The same proof of identity the gRPC port demands.
		httpStatus(w, http.StatusForbidden)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, DefaultMaxJSONBody))
	if err != nil {
		s.log.Warn("json: read body", "err", err)
		httpStatus(w, http.StatusBadRequest)
		return
	}
	if !s.jsonWithinShape(body) {
		s.log.Warn("json: decode request", "err", "more JSON objects than the request bounds allow")
		httpStatus(w, http.StatusBadRequest)
		return
	}
	var req rlpb.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		s.log.Warn("json: decode request", "err", err)
		httpStatus(w, http.StatusBadRequest)
		return
	}
	resp, err := s.d.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		s.log.Warn("json: ShouldRateLimit", "err", err)
		httpStatus(w, http.StatusBadRequest)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		httpStatus(w, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch resp.OverallCode {
	case rlpb.RateLimitResponse_UNKNOWN:
		w.WriteHeader(http.StatusInternalServerError)
	case rlpb.RateLimitResponse_OVER_LIMIT:
		w.WriteHeader(http.StatusTooManyRequests)
	}
	_, _ = w.Write(out)
}

// jsonWithinShape reports whether body holds no more JSON objects than a
// request within s.shape can (the request, and per descriptor itself, its
// limit override and its entries), counted before protojson builds them:
// "{}," is 3 bytes and a decoded descriptor about 160, so a 4 MiB body of
// them made 1.4 million descriptors (228 MB) before the engine counted
// them. A body that is not JSON is left to protojson to refuse.
func (s *Server) jsonWithinShape(body []byte) bool {
	if s.shape.descriptors <= 0 || s.shape.entries <= 0 {
		return true
	}
	limit := 1 + s.shape.descriptors*(s.shape.entries+2)
	dec := json.NewDecoder(bytes.NewReader(body))
	for n := 0; ; {
		tok, err := dec.Token()
		if err != nil {
			return true
		}
		if d, ok := tok.(json.Delim); ok && d == '{' {
			if n++; n > limit {
				return false
			}
		}
	}
}

func httpStatus(w http.ResponseWriter, code int) {
	http.Error(w, http.StatusText(code), code)
}

func (s *Server) debugMux(metricsH http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	endpoints := map[string]string{
		"/rlconfig":            "print out the currently loaded configuration for debugging",
		"/debug/pprof/":        "root of various pprof endpoints. hit for help.",
		"/debug/pprof/profile": "CPU profiling endpoint",
		"/debug/pprof/trace":   "trace endpoint",
		"/metrics":             "Prometheus metrics",
	}
	mux.HandleFunc("/rlconfig", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, s.d.Config().Dump())
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/metrics", metricsH)
	if s.o.Ledger != nil {
		// /ledger/ itself answers 404: the index lists what answers.
		endpoints["/ledger/keys"] = "the embedded store's usage ledger: its rule windows (/ledger/window?domain=&rule=&window= reads one), read by budgetgen report --service"
		mux.Handle("/ledger/", ledger.Handler(s.o.Ledger))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		keys := make([]string, 0, len(endpoints))
		for k := range endpoints {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, "%s: %s\n", k, endpoints[k])
		}
		_, _ = io.WriteString(w, b.String())
	})
	return mux
}

// OptionalClientCert returns base for the HTTP port: a client certificate,
// when given, must verify against the same CAs as on the gRPC port, but a
// client without one (the kubelet's HTTPS probe) may connect, so that
// /healthcheck answers it while /json refuses it (Options.HTTPTLS).
func OptionalClientCert(base *tls.Config) *tls.Config {
	c := base.Clone()
	relax := func(cc *tls.Config) *tls.Config {
		if cc.ClientAuth == tls.RequireAndVerifyClientCert {
			cc.ClientAuth = tls.VerifyClientCertIfGiven
		}
		return cc
	}
	relax(c)
	if get := base.GetConfigForClient; get != nil {
		c.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			cc, err := get(h)
			if err != nil || cc == nil {
				return cc, err
			}
			return relax(cc.Clone()), nil
		}
	}
	return c
}
