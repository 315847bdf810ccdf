// Package service wires settings, store, engine, config source and servers
// into the rate limit service that cmd/ratelimit runs.
package service

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/budgetgen/budgetgen/internal/buildinfo"
	"github.com/budgetgen/budgetgen/internal/eventsink"
	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/engine"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/observe"
	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
	"github.com/budgetgen/budgetgen/internal/ratelimit/settings"
	"github.com/budgetgen/budgetgen/internal/ratelimit/source"
	"github.com/budgetgen/budgetgen/internal/ratelimit/storemetrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/memory"
	"github.com/budgetgen/budgetgen/internal/store/valkey"
	"github.com/budgetgen/budgetgen/internal/thresholds"
	"github.com/budgetgen/budgetgen/internal/tlsconfig"
)

// ErrUsage marks settings errors (exit code 2 in main).
var ErrUsage = errors.New("usage")

// Run starts the service and blocks until ctx is done (then drains) or a
// listener fails. Settings come from args and getenv; logs go to logOut.
// ready, if non-nil, is called with the running server once it listens.
// It is RunWith without a way to skip SHUTDOWN_DELAY.
func Run(ctx context.Context, args []string, getenv func(string) string, logOut io.Writer, ready func(*server.Server)) error {
	return RunWith(ctx, Options{Args: args, Getenv: getenv, Log: logOut, Ready: ready})
}

// Options are what RunWith takes besides its context.
type Options struct {
	// Args are the command-line flags.
	Args []string
	// Getenv reads the settings' environment variables; nil = os.Getenv.
	Getenv func(string) string
	// Log receives the logs; nil = os.Stderr.
	Log io.Writer
	// Ready, if non-nil, is called with the running server once it listens.
	Ready func(*server.Server)
	// SkipDelay, when closed, ends SHUTDOWN_DELAY early: cmd/ratelimit
	// closes it at the second SIGTERM or SIGINT. nil: the delay runs in full.
	SkipDelay <-chan struct{}
}

// RunWith starts the service and blocks until ctx is done or a listener
// fails. When ctx is done it fails readiness, keeps serving for
// SHUTDOWN_DELAY (or until o.SkipDelay closes), then closes the listeners,
// drains in-flight calls and stops the components.
//
// RunWith is the composition root: settings are plain values, and the steps
// of runner.run turn them into components in the order the data flows
// (store, observers, engine, server, config sources). Each step registers
// how it stops; they stop in the reverse order.
func RunWith(ctx context.Context, o Options) error {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	s, err := settings.Load(o.Args, o.Getenv, o.Log)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	r := newRunner(s, o.Log)
	r.skipDelay = o.SkipDelay
	defer r.stop.run()
	return r.run(ctx, o.Getenv, o.Ready)
}

// runner is one run of the service: the settings, the logs and metrics
// every component shares, and the stop steps registered so far.
type runner struct {
	s   settings.Settings
	log *slog.Logger
	// startup logs start-up facts at INFO (the default LOG_LEVEL); what
	// needs a look is WARN.
	startup *slog.Logger
	reg     *prometheus.Registry
	metrics *metrics.Metrics
	stop    shutdown
	// skipDelay, when closed, ends SHUTDOWN_DELAY early (Options.SkipDelay).
	skipDelay <-chan struct{}
	// softLimit is the Go soft memory limit tuneRuntime set from the
	// container's limit; 0 when it set none.
	softLimit int64
}

// shutdown is the stop steps of what started, run in the reverse order.
type shutdown []func()

func (sd *shutdown) add(f func()) { *sd = append(*sd, f) }

// run is a pointer method, so a deferred r.stop.run() sees the steps added
// after the defer statement.
func (sd *shutdown) run() {
	for i := len(*sd) - 1; i >= 0; i-- {
		(*sd)[i]()
	}
}

func newRunner(s settings.Settings, logOut io.Writer) *runner {
	log := newLogger(s, logOut)
	r := &runner{s: s, log: log, startup: log.With("phase", "startup"), reg: prometheus.NewRegistry()}
	for _, u := range s.Unsupported {
		r.startup.Warn("unsupported setting", "detail", u)
	}
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r.metrics = metrics.NewWith(r.reg, metrics.Options{TopPrincipals: topPrincipals(s.BudgetUsageTopPrincipals)})
	return r
}

// run starts the components, serves, and returns when serving ends.
func (r *runner) run(ctx context.Context, getenv func(string) string, ready func(*server.Server)) error {
	x, err := r.exposure()
	if err != nil {
		return err
	}
	r.tuneRuntime(getenv)
	st, err := r.startStore()
	if err != nil {
		return err
	}
	windows, err := r.s.Windows()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	r.startup.Info("counter windows", "mode", windows.Mode().String(), "time_zone", windows.Location().String())
	obs, err := r.observers(ctx, st, windows)
	if err != nil {
		return err
	}
	eng, err := r.engine(st.st, windows, obs)
	if err != nil {
		return err
	}
	srv, err := r.server(eng, st, x)
	if err != nil {
		return err
	}
	return r.serve(ctx, eng, srv, st, x, ready)
}

// tuneRuntime applies GC_PERCENT (unless GOGC is set) and MEMORY_LIMIT_RATIO.
func (r *runner) tuneRuntime(getenv func(string) string) {
	if getenv("GOGC") == "" && r.s.GCPercent > 0 {
		debug.SetGCPercent(r.s.GCPercent)
	}
	if limit, set, err := applyMemoryLimit(r.s.MemoryLimitRatio, getenv, memlimit.FromCgroup); err != nil {
		r.startup.Warn("memory limit: cgroup not readable, Go soft memory limit left as it was", "err", err)
	} else if set {
		r.softLimit = limit
		r.startup.Info("memory limit", "go_soft_limit_bytes", limit, "ratio", r.s.MemoryLimitRatio)
	}
}

// exposure is how the ports are exposed: the gRPC port's TLS, and whether
// and how the HTTP port serves /json (jsonExposure).
type exposure struct {
	grpcTLS, httpTLS *tls.Config
	disableJSON      bool
}

func (r *runner) exposure() (exposure, error) {
	var x exposure
	if r.s.GRPCServerUseTLS {
		tc, err := grpcServerTLS(r.s)
		if err != nil {
			return x, err
		}
		x.grpcTLS = tc
	}
	x.disableJSON, x.httpTLS = jsonExposure(r.s, x.grpcTLS)
	return x, nil
}

// openedStore is the counter store and what the other steps need of it.
type openedStore struct {
	st store.Store
	// ledger is the embedded store's in-process ledger (the debug port
	// serves it); nil with Valkey.
	ledger *ledger.Memory
	// desc describes the store in logs ("valkey standalone ...").
	desc string
}

// startStore opens the counter store, registers its own metrics and, for
// the embedded store, restores and keeps its snapshot.
func (r *runner) startStore() (*openedStore, error) {
	s := r.s
	if s.UseMemoryStore() && s.MemoryMaxBytes == 0 {
		s.MemoryMaxBytes = embeddedByteBound(r.softLimit)
		r.startup.Info("embedded store byte bound", "memory_max_bytes", s.MemoryMaxBytes, "go_soft_limit_bytes", r.softLimit)
	}
	st, lm, desc, err := openStore(s, r.log)
	if err != nil {
		return nil, err
	}
	storemetrics.Register(r.reg, st)
	r.stop.add(func() {
		if err := st.Close(); err != nil {
			r.log.Warn("close store", "err", err)
		}
	})
	r.startup.Info("counter store", "store", desc, "key_format", s.KeyFormat.String(), "failure_policy", s.FailurePolicy.String(), "store_timeout", s.StoreTimeout.String())
	ms, ok := st.(*memory.Store)
	switch {
	case ok && s.MemorySnapshotPath != "":
		stop, err := startSnapshots(s, ms, lm, r.reg, r.log, r.startup)
		if err != nil {
			return nil, err
		}
		// Stops before the store's Close, and after the engine (stopped
		// earlier, as it starts later) has drained and charged its last hits.
		r.stop.add(stop)
	case ok:
		r.startup.Warn("embedded store: no state kept (MEMORY_SNAPSHOT_PATH=off): a restart forgets every budget's counts")
	}
	return &openedStore{st: st, ledger: lm, desc: desc}, nil
}

// observers are told every decision's outcome: the metrics, the shadow-week
// ledger and the 80/90/100% threshold events (read back by budgetgen
// report), and the store outage log.
func (r *runner) observers(ctx context.Context, st *openedStore, windows window.Windows) ([]observe.Observer, error) {
	rec, err := r.startLedger(ctx, st.st, windows)
	if err != nil {
		return nil, err
	}
	det, err := r.thresholds()
	if err != nil {
		return nil, err
	}
	return []observe.Observer{
		observe.NewMetrics(r.metrics),
		&observe.Ledger{Recorder: rec, Thresholds: det},
		&observe.StoreWatch{Logger: r.log, Store: st.desc},
	}, nil
}

// startLedger starts the ledger's recorder (per rule, window and principal
// usage; denials). Its flushes go through the store (store.HashWriter): the
// valkey store's in-flight bound and stall guard cover them.
func (r *runner) startLedger(ctx context.Context, st store.Store, windows window.Windows) (*ledger.Recorder, error) {
	hw, ok := st.(store.HashWriter)
	if !ok {
		return nil, fmt.Errorf("counter store %T cannot hold the ledger", st)
	}
	o := ledger.Options{Prefix: r.s.CacheKeyPrefix, RetentionDays: r.s.LedgerRetentionDays, Location: windows.Location()}
	rec, err := ledger.NewRecorder(o, ledger.NewStoreSink(hw), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	ledgerCtx, stopLedger := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		rec.Run(ledgerCtx, ledgerFlushInterval, func(err error) { r.log.Warn("ledger flush failed", "err", err) })
		close(done)
	}()
	r.stop.add(func() { stopLedger(); <-done })
	return rec, nil
}

// thresholds builds the threshold detector; with THRESHOLD_EVENTS_URL its
// crossings leave the process as CloudEvents, and a slow or failing
// receiver only fills a bounded queue (drops are counted).
func (r *runner) thresholds() (*thresholds.Detector, error) {
	topts := thresholds.Options{Logger: r.log, Registerer: r.reg}
	if r.s.ThresholdEventsURL != "" {
		sink, err := eventsink.New(eventsink.Options{URL: r.s.ThresholdEventsURL, Registerer: r.reg, Logger: r.log})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUsage, err)
		}
		r.stop.add(func() {
			ctx, cancel := context.WithTimeout(context.Background(), eventsinkDrain)
			defer cancel()
			sink.Close(ctx)
		})
		topts.Sink = sink
		r.startup.Info("threshold events", "sink", "cloudevents")
	}
	return thresholds.New(topts)
}

// engine builds the decision engine from the decision settings.
func (r *runner) engine(st store.Store, windows window.Windows, obs []observe.Observer) (*engine.Engine, error) {
	s := r.s
	eng, err := engine.New(engine.Options{
		Store: st, Keys: keyEncoder(s), Windows: windows, NearLimitRatio: s.NearLimitRatio, ShadowMode: s.ShadowMode,
		StoreTimeout: s.StoreTimeout, FailurePolicy: s.FailurePolicy, Grace: s.Grace, HoldExpiry: s.ReservationExpiry,
		OverLimitCacheSize: s.OverLimitCacheSize, Logger: r.log, BatchWorkers: s.StoreBatchWorkers,
		Observers: obs,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	r.stop.add(func() {
		// Charges pending over-limit hits; nothing to return it to at
		// shutdown, so it is logged.
		if err := eng.Close(); err != nil {
			r.log.Warn("closing the engine", "err", err)
		}
	})
	return eng, nil
}

// server builds the gRPC, HTTP, debug and metrics listeners over eng.
func (r *runner) server(eng *engine.Engine, st *openedStore, x exposure) (*server.Server, error) {
	s := r.s
	metricsAddr := ""
	if s.UsePrometheus {
		metricsAddr = s.PrometheusAddr
	}
	if !isLoopbackHost(s.DebugHost) {
		r.startup.Warn("debug port exposed beyond loopback: pprof, /rlconfig and /ledger/ answer anyone who reaches it", "debug_host", s.DebugHost)
	}
	return server.New(eng, server.Options{
		DisableJSON: x.disableJSON, HTTPTLS: x.httpTLS,
		GRPCAddr: s.GRPCAddr(), HTTPAddr: s.HTTPAddr(), DebugAddr: s.DebugAddr(),
		MetricsAddr: metricsAddr, MetricsPath: s.PrometheusPath, Gatherer: r.reg,
		MaxConnectionAge: s.GRPCMaxConnectionAge, MaxConnectionAgeGrace: s.GRPCMaxConnectionAgeGrace,
		RequireConfigForHealth: s.HealthyWithAtLeastOneConfigLoaded, Logger: r.log, StreamWorkers: s.GRPCStreamWorkers, TLS: x.grpcTLS,
		Ledger:    ledgerReader(st.ledger),
		Transport: s.GRPCServerImpl, MaxConnections: s.GRPCMaxConnections, IdleTimeout: s.GRPCIdleTimeout, Registerer: r.reg,
	})
}

// serve starts the config sources, serves until ctx is done (then serves
// on, not ready, for SHUTDOWN_DELAY and drains in-flight calls) or a
// listener fails, and stops the sources (at ctx's end: the engine keeps the
// config it has during the delay).
func (r *runner) serve(ctx context.Context, eng *engine.Engine, srv *server.Server, st *openedStore, x exposure, ready func(*server.Server)) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if vs, ok := st.st.(*valkey.Store); ok {
		waitValkey(sctx, vs, srv.Health(), r.log, st.desc, r.s.FailurePolicy.String())
	}
	var src configSources
	if err := r.startConfig(sctx, r.applier(eng, srv), &src); err != nil {
		cancel()
		src.wg.Wait()
		return err
	}
	g, h, d, mt := srv.Addrs()
	r.startup.Info("listening", "version", buildinfo.Read().Version, "log_level", r.s.LogLevel, "grpc", addrString(g), "http", addrString(h), "debug", addrString(d), "metrics", addrString(mt), "config", src.from, "grpc_tls", x.grpcTLS != nil, "json", jsonState(x.disableJSON, x.httpTLS))
	if ready != nil {
		ready(srv)
	}
	noted := make(chan struct{})
	stopNote := context.AfterFunc(ctx, func() {
		r.log.Info("shutting down: not ready, serving for the shutdown delay, then draining in-flight calls",
			"shutdown_delay", r.s.ShutdownDelay.String(), "drain_limit", shutdownDrain.String())
		close(noted)
	})
	err := srv.ServeStop(sctx, server.Stop{Delay: r.s.ShutdownDelay, Skip: r.skipDelay, Drain: shutdownDrain})
	if !stopNote() {
		<-noted // logged before "stopped"
	}
	cancel()
	src.wg.Wait()
	logStopped(r.log, err)
	return err
}

// applier hands every config source's loads to the engine and keeps the
// health check's config component in step.
func (r *runner) applier(eng *engine.Engine, srv *server.Server) *source.Applier {
	return &source.Applier{Sink: eng, Metrics: r.metrics, Logger: r.log, OnLoaded: func(c *config.Config) {
		if c.Empty() {
			srv.Health().Fail(server.ComponentConfig)
		} else {
			srv.Health().OK(server.ComponentConfig)
		}
	}}
}

// configSources are the running config sources; wg ends when all have
// stopped after their context is done.
type configSources struct {
	wg sync.WaitGroup
	// from says where configs come from, for the start-up log.
	from string
}

// startConfig starts the sources feeding a: the budget map first (so no
// counter is ever keyed without it), then the config files, or the xDS
// client with the files beside it (agentgateway's domains, merged with
// Envoy Gateway's xDS config). The first load must succeed unless
// FORCE_START_WITHOUT_INITIAL_CONFIG. On an error the caller cancels ctx
// and waits for what started.
func (r *runner) startConfig(ctx context.Context, a *source.Applier, src *configSources) error {
	s := r.s
	src.from = s.DirOptions().Dir()
	if s.BudgetMapPath != "" {
		if err := startBudgetMap(ctx, s, a, &src.wg); err != nil {
			return err
		}
	}
	if s.ConfigType != "GRPC_XDS_SOTW" {
		files := &source.Files{Dir: s.DirOptions(), Interval: s.ConfigPollInterval}
		if err := files.Load(a); err != nil && !s.ForceStartWithoutInitialConfig {
			return fmt.Errorf("initial config: %w", err)
		}
		src.wg.Add(1)
		go func() { defer src.wg.Done(); _ = files.Run(ctx, a) }()
		return nil
	}
	if s.ConfigDir != "" {
		if err := startExtraFiles(ctx, s, a, &src.wg); err != nil {
			return err
		}
	}
	xc, err := newXDSClient(s, a, r.log)
	if err != nil {
		return err
	}
	// Registered only here, with the xDS source: a file-configured service
	// has no stream, and a stream gauge at 0 on it would read as a stream
	// down (and fire RateLimitXDSStreamDown).
	r.reg.MustRegister(xc.Collector())
	src.wg.Add(1)
	go func() { defer src.wg.Done(); _ = xc.Run(ctx) }()
	if err := waitFirstXDSConfig(ctx, s, xc); err != nil {
		return err
	}
	src.from = "xds " + s.XDSServerURL
	return nil
}

// shutdownDrain bounds how long in-flight calls may finish at shutdown.
const shutdownDrain = 5 * time.Second

// logStopped logs the end of Serve: a clean stop (a signal) is INFO, a
// listener failure ERROR. Closing the engine and the store follows (their
// own errors are logged by their stop steps).
func logStopped(log *slog.Logger, err error) {
	if err != nil {
		log.Error("stopped: a listener failed", "err", err)
		return
	}
	log.Info("stopped: listeners closed after draining in-flight calls", "drain_limit", shutdownDrain.String())
}

// waitValkey keeps the health check not ready until Valkey answers, so a
// rollout waits for it; requests meanwhile get the failure policy and their
// charges are buffered. The wait and its end are logged.
func waitValkey(ctx context.Context, vs *valkey.Store, h *server.Health, log *slog.Logger, desc, policy string) {
	select {
	case <-vs.Connected():
		return
	default:
	}
	h.FailBecause(server.ComponentStore, "valkey has not answered since start ("+desc+"); charges are buffered and answered by FAILURE_POLICY="+policy)
	log.Warn("valkey unreachable at start: health check not ready until it answers; charges are buffered and answered by the failure policy", "phase", "startup", "store", desc, "failure_policy", policy)
	t0 := time.Now()
	go func() {
		select {
		case <-vs.Connected():
			h.OK(server.ComponentStore)
			log.Info("valkey connected: health check ready", "store", desc, "waited", time.Since(t0).Round(time.Millisecond).String(), "buffer_keys", vs.Stats().BufferKeys)
		case <-ctx.Done():
		}
	}()
}

// topPrincipals maps BUDGET_USAGE_TOP_PRINCIPALS (0 = off) to
// metrics.Options.TopPrincipals (negative = off).
func topPrincipals(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// jsonExposure decides how the HTTP port serves /json (HTTP_JSON): never as
// a way around the gRPC port's client certificates. With auto, /json is off
// when gRPC requires them; with true, the HTTP port then serves TLS and /json
// demands a verified client certificate, while /healthcheck stays open for
// probes that present none.
func jsonExposure(s settings.Settings, grpcTLS *tls.Config) (disable bool, httpTLS *tls.Config) {
	mtls := grpcTLS != nil && s.GRPCClientTLSCACert != ""
	switch strings.ToLower(s.HTTPJSON) {
	case settings.HTTPJSONFalse:
		return true, nil
	case settings.HTTPJSONTrue:
		if mtls {
			return false, server.OptionalClientCert(grpcTLS)
		}
		return false, nil
	default: // auto
		return mtls, nil
	}
}

func jsonState(disabled bool, httpTLS *tls.Config) string {
	switch {
	case disabled:
		return "off"
	case httpTLS != nil:
		return "tls+client-cert"
	}
	return "on"
}

// isLoopbackHost reports whether host (DEBUG_HOST) binds loopback only.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func addrString(a interface{ String() string }) string {
	if a == nil || fmt.Sprint(a) == "<nil>" {
		return ""
	}
	return a.String()
}

func newLogger(s settings.Settings, out io.Writer) *slog.Logger {
	var lvl slog.Level
	switch strings.ToLower(s.LogLevel) {
	case "debug", "trace":
		lvl = slog.LevelDebug
	case "info":
		lvl = slog.LevelInfo
	case "warn", "warning":
		lvl = slog.LevelWarn
	default:
		lvl = slog.LevelError
	}
	o := &slog.HandlerOptions{Level: lvl}
	if strings.EqualFold(s.LogFormat, "json") {
		return slog.New(slog.NewJSONHandler(out, o))
	}
	return slog.New(slog.NewTextHandler(out, o))
}

// ledgerFlushInterval is how often the ledger's denial counts and expiries
// are written (docs/measurement.md).
const ledgerFlushInterval = 5 * time.Second

// eventsinkDrain bounds how long shutdown waits for queued threshold events.
const eventsinkDrain = 3 * time.Second

// ledgerReader is the ledger the debug port serves: the embedded store's,
// which only this process holds (a Valkey ledger is read from Valkey).
func ledgerReader(m *ledger.Memory) ledger.Reader {
	if m == nil {
		return nil // a nil *ledger.Memory must not become a non-nil Reader
	}
	return m
}

// startSnapshots restores the embedded store's snapshot and starts writing it
// every MEMORY_SNAPSHOT_INTERVAL; stop ends that and writes the shutdown
// snapshot. A snapshot that cannot be read is a start-up error naming the
// file (never a silent empty start: that is the budget lost).
func startSnapshots(s settings.Settings, ms *memory.Store, lm *ledger.Memory, reg prometheus.Registerer, log, startup *slog.Logger) (stop func(), err error) {
	sn := &memory.Snapshotter{Path: s.MemorySnapshotPath, Store: ms, Interval: s.MemorySnapshotInterval, Logger: log}
	storemetrics.RegisterSnapshot(reg, sn)
	if lm != nil {
		sn.Ledger = lm
	}
	release, err := sn.Claim()
	if err != nil {
		return nil, fmt.Errorf("%w (set MEMORY_SNAPSHOT_PATH to a writable file of this service's own, or to off to keep no state)", err)
	}
	rs, err := sn.Restore()
	if err != nil {
		release()
		return nil, fmt.Errorf("%w (move it away to start empty)", err)
	}
	if err := firstSnapshot(sn, startup); err != nil {
		release()
		return nil, err
	}
	startup.Info("embedded store: state kept in the memory snapshot (MEMORY_SNAPSHOT_PATH; off keeps none)", "path", s.MemorySnapshotPath, "counters", rs.Counters, "ledger_hashes", rs.Hashes,
		"expired_counters", rs.ExpiredCounters, "expired_ledger_hashes", rs.ExpiredHashes, "over_bound", rs.OverBound, "interval", s.MemorySnapshotInterval.String())
	if others := otherSnapshots(s.MemorySnapshotPath, rs.Found); len(others) > 0 {
		startup.Warn("embedded store: no snapshot at this path, so every budget starts from zero, but the directory holds others (a changed GRPC_PORT names another default file): if one is this service's, stop it and set MEMORY_SNAPSHOT_PATH to it",
			"path", s.MemorySnapshotPath, "others", others)
	}
	if rs.OverBound > 0 {
		startup.Warn("embedded store: the snapshot holds more live counters than MEMORY_MAX_COUNTERS or more bytes than MEMORY_MAX_BYTES; all are kept, and a request needing a new counter gets MEMORY_FULL_POLICY until windows end",
			"counters", ms.Stats().Counters, "bytes", ms.Stats().Bytes, "over_bound", rs.OverBound)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sn.Run(ctx); close(done) }()
	return func() {
		cancel()
		<-done
		if err := sn.Write(); err != nil {
			log.Error("shutdown memory snapshot failed; the previous one is kept", "err", err)
		}
		release()
	}, nil
}

// firstSnapshot writes the snapshot once at start, so an unwritable place
// stops the start instead of losing the budgets at the first restart. A full
// volume (ENOSPC, EDQUOT) is no such mistake, and the restored counts are in
// memory: refusing to start would leave every budget unenforced (Envoy fails
// open) or every request refused until space is freed, so the service
// starts, says so at error level, and retries every interval
// (ratelimit_memory_snapshot_failures_total counts the failures).
func firstSnapshot(sn *memory.Snapshotter, startup *slog.Logger) error {
	err := sn.Write()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT):
		startup.Error("embedded store: the snapshot cannot be written, no space left: serving with the restored counts and retrying every interval; a crash before a write succeeds loses what is charged meanwhile",
			"path", sn.Path, "err", err)
		return nil
	}
	return fmt.Errorf("memory snapshot %s: %w (set MEMORY_SNAPSHOT_PATH to a writable file, or to off to keep no state)", sn.Path, err)
}

// otherSnapshots lists, when path was not found, the other snapshot files
// (*.snapshot) in its directory: the default file is named by the gRPC port,
// so a service restarted with another port finds its counts under another
// name.
func otherSnapshots(path string, found bool) []string {
	if found {
		return nil
	}
	names, err := filepath.Glob(filepath.Join(filepath.Dir(path), "*.snapshot"))
	if err != nil {
		return nil
	}
	out := names[:0]
	for _, n := range names {
		if n != filepath.Clean(path) {
			out = append(out, n)
		}
	}
	return out
}

// openStore opens the counter store; with the embedded store it also
// returns the in-process ledger it holds.
func openStore(s settings.Settings, log *slog.Logger) (store.Store, *ledger.Memory, string, error) {
	if s.UseMemoryStore() {
		lm := ledger.NewMemory(s.CacheKeyPrefix, nil)
		return memory.New(memory.Options{MaxCounters: s.MemoryMaxCounters, MaxBytes: int64(s.MemoryMaxBytes), Ledger: lm, Grace: s.Grace, FullPolicy: memoryFullPolicy(s.MemoryFullPolicy)}), lm, "memory (embedded; no REDIS_URL set: counters are local to this replica)", nil
	}
	auth, err := secret(s.RedisAuth, s.RedisAuthFile, "REDIS_AUTH_FILE")
	if err != nil {
		return nil, nil, "", err
	}
	sauth, err := secret(s.RedisSentinelAuth, s.RedisSentinelAuthFile, "REDIS_SENTINEL_AUTH_FILE")
	if err != nil {
		return nil, nil, "", err
	}
	user, pass := settings.RedisCredentials(auth)
	suser, spass := settings.RedisCredentials(sauth)
	o := valkey.Options{
		Username: user, Password: pass, SentinelUsername: suser, SentinelPassword: spass,
		DialTimeout: s.RedisTimeout, Logger: log,
		MaxFlushDelay: s.ValkeyMaxFlushDelay, PipelineMultiplex: s.ValkeyPipelineMultiplex,
		IdempotencyWindow: s.ValkeyIdempotencyWindow, KeyPrefix: s.CacheKeyPrefix,
		BufferMaxBytes: int64(s.ValkeyBufferMaxBytes), // 0: the store's default
	}
	switch s.Redis.Type {
	case settings.RedisCluster:
		o.Mode, o.Addresses = valkey.Cluster, s.Redis.Addresses
	case settings.RedisSentinel:
		o.Mode, o.MasterSet, o.Addresses = valkey.Sentinel, s.Redis.MasterSet, s.Redis.Addresses
	default:
		o.Mode, o.Addresses = valkey.Standalone, s.Redis.Addresses
	}
	if s.RedisTLS {
		tc, err := redisTLS(s)
		if err != nil {
			return nil, nil, "", err
		}
		o.TLS = tc
	}
	// Valkey unreachable at start is an outage like any other: the service
	// starts, answers by its failure policy, buffers the charges, reports
	// not ready (Run) and connects in the background.
	o.ConnectInBackground = true
	st, err := valkey.New(o)
	if err != nil {
		return nil, nil, "", err
	}
	return st, nil, fmt.Sprintf("valkey %s %s (tls=%t)", o.Mode, strings.Join(o.Addresses, ","), s.RedisTLS), nil
}

// memoryFullPolicy maps MEMORY_FULL_POLICY to the embedded store's policy
// (TestSettingsAgreeWithComponents checks that their names agree).
func memoryFullPolicy(p settings.MemoryFullPolicy) memory.FullPolicy {
	if p == settings.MemoryFullFailurePolicy {
		return memory.FullFailurePolicy
	}
	return memory.FullDeny
}

// secret returns value, or the content of file (one trailing newline
// dropped, as a mounted secret often has). Errors name the setting and the
// path, never the content.
func secret(value, file, setting string) (string, error) {
	if file == "" {
		return value, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", setting, err)
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if v == "" {
		return "", fmt.Errorf("%s: %s is empty", setting, file)
	}
	return v, nil
}

// redisTLS builds the client TLS config from REDIS_TLS_* files, as the
// reference does: optional client pair, optional CA (system roots
// otherwise), and hostname verification that can be skipped while the chain
// is still verified. Files are loaded by internal/tlsconfig (errors name
// the file).
func redisTLS(s settings.Settings) (*tls.Config, error) {
	tc, err := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: s.RedisTLSClientCert, KeyFile: s.RedisTLSClientKey, CAFile: s.RedisTLSCACert})
	if err != nil {
		return nil, fmt.Errorf("REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY, REDIS_TLS_CACERT: %w", err)
	}
	if s.RedisTLSSkipHostnameVerification {
		roots := tc.RootCAs
		tc.InsecureSkipVerify = true
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("valkey tls: no server certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
			return err
		}
	}
	return tc, nil
}
