// Package service wires settings, store, engine, config source and servers
// into the rate limit service that cmd/ratelimit runs.
package service

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/KimMachineGun/automemlimit/memlimit"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

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
func Run(ctx context.Context, args []string, getenv func(string) string, logOut io.Writer, ready func(*server.Server)) error {
	s, err := settings.Load(args, getenv, logOut)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	log := newLogger(s, logOut)
	// Start-up facts are INFO (the default LOG_LEVEL); what needs a look is
	// WARN.
	startup := log.With("phase", "startup")
	for _, u := range s.Unsupported {
		startup.Warn("unsupported setting", "detail", u)
	}
	var serverTLS *tls.Config
	if s.GRPCServerUseTLS {
		if serverTLS, err = grpcServerTLS(s); err != nil {
			return err
		}
	}

	if getenv("GOGC") == "" && s.GCPercent > 0 {
		debug.SetGCPercent(s.GCPercent)
	}
	if limit, set, err := applyMemoryLimit(s.MemoryLimitRatio, getenv, memlimit.FromCgroup); err != nil {
		startup.Warn("memory limit: cgroup not readable, Go soft memory limit left as it was", "err", err)
	} else if set {
		startup.Info("memory limit", "go_soft_limit_bytes", limit, "ratio", s.MemoryLimitRatio)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.NewWith(reg, metrics.Options{TopPrincipals: topPrincipals(s.BudgetUsageTopPrincipals)})

	st, ledgerMem, desc, err := openStore(s, log)
	if err != nil {
		return err
	}
	storemetrics.Register(reg, st)
	defer func() {
		if err := st.Close(); err != nil {
			log.Warn("close store", "err", err)
		}
	}()
	startup.Info("counter store", "store", desc, "key_format", s.KeyFormat.String(), "failure_policy", s.FailurePolicy.String(), "store_timeout", s.StoreTimeout.String())
	if ms, ok := st.(*memory.Store); ok && s.MemorySnapshotPath != "" {
		stop, err := startSnapshots(s, ms, ledgerMem, log, startup)
		if err != nil {
			return err
		}
		// Deferred after the store's Close, so it runs before it and after
		// the engine (deferred later) has drained and charged its last hits.
		defer stop()
	} else if ok {
		startup.Warn("embedded store: no state kept (MEMORY_SNAPSHOT_PATH=off): a restart forgets every budget's counts")
	}

	// The shadow-week ledger (per rule, day and principal usage; denials) and
	// the 80/90/100% threshold events, read back by budgetgen report.
	windows, err := s.Windows()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	startup.Info("counter windows", "mode", windows.Mode().String(), "time_zone", windows.Location().String())
	// Its flushes go through the store (store.HashWriter): the valkey store's
	// in-flight bound and stall guard cover them.
	hw, ok := st.(store.HashWriter)
	if !ok {
		return fmt.Errorf("counter store %T cannot hold the ledger", st)
	}
	rec, err := ledger.NewRecorder(ledger.Options{Prefix: s.CacheKeyPrefix, RetentionDays: s.LedgerRetentionDays, Location: windows.Location()}, ledger.NewStoreSink(hw), nil)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	ledgerCtx, stopLedger := context.WithCancel(context.WithoutCancel(ctx))
	ledgerDone := make(chan struct{})
	go func() {
		rec.Run(ledgerCtx, ledgerFlushInterval, func(err error) { log.Warn("ledger flush failed", "err", err) })
		close(ledgerDone)
	}()
	defer func() { stopLedger(); <-ledgerDone }()
	topts := thresholds.Options{Logger: log, Registerer: reg}
	if s.ThresholdEventsURL != "" {
		// Crossings leave the process as CloudEvents; a slow or failing
		// receiver only fills a bounded queue (drops are counted).
		sink, err := eventsink.New(eventsink.Options{URL: s.ThresholdEventsURL, Registerer: reg, Logger: log})
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUsage, err)
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), eventsinkDrain)
			defer cancel()
			sink.Close(ctx)
		}()
		topts.Sink = sink
		startup.Info("threshold events", "sink", "cloudevents")
	}
	det, err := thresholds.New(topts)
	if err != nil {
		return err
	}

	eng, err := engine.New(engine.Options{
		Ledger: rec, Thresholds: det,
		Store: st, Keys: keyEncoder(s), Windows: windows, NearLimitRatio: s.NearLimitRatio, ShadowMode: s.ShadowMode,
		StoreTimeout: s.StoreTimeout, FailurePolicy: s.FailurePolicy, Grace: s.Grace, HoldExpiry: s.ReservationExpiry,
		OverLimitCacheSize: s.OverLimitCacheSize, Metrics: m, Logger: log, BatchWorkers: s.StoreBatchWorkers,
		Observers: []observe.Observer{&observe.StoreWatch{Logger: log, Store: desc}},
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	defer func() {
		// Charges pending over-limit hits; nothing to return it to at
		// shutdown, so it is logged.
		if err := eng.Close(); err != nil {
			log.Warn("closing the engine", "err", err)
		}
	}()

	metricsAddr := ""
	if s.UsePrometheus {
		metricsAddr = s.PrometheusAddr
	}
	disableJSON, httpTLS := jsonExposure(s, serverTLS)
	if !isLoopbackHost(s.DebugHost) {
		startup.Warn("debug port exposed beyond loopback: pprof, /rlconfig and /ledger/ answer anyone who reaches it", "debug_host", s.DebugHost)
	}
	srv, err := server.New(eng, server.Options{
		DisableJSON: disableJSON, HTTPTLS: httpTLS,
		GRPCAddr: s.GRPCAddr(), HTTPAddr: s.HTTPAddr(), DebugAddr: s.DebugAddr(),
		MetricsAddr: metricsAddr, MetricsPath: s.PrometheusPath, Gatherer: reg,
		MaxConnectionAge: s.GRPCMaxConnectionAge, MaxConnectionAgeGrace: s.GRPCMaxConnectionAgeGrace,
		RequireConfigForHealth: s.HealthyWithAtLeastOneConfigLoaded, Logger: log, StreamWorkers: s.GRPCStreamWorkers, TLS: serverTLS,
		Ledger:    ledgerReader(ledgerMem),
		Transport: s.GRPCServerImpl, MaxConnections: s.GRPCMaxConnections, IdleTimeout: s.GRPCIdleTimeout, Registerer: reg,
	})
	if err != nil {
		return err
	}
	applier := &source.Applier{Sink: eng, Metrics: m, Logger: log, OnLoaded: func(c *config.Config) {
		if c.Empty() {
			srv.Health().Fail(server.ComponentConfig)
		} else {
			srv.Health().OK(server.ComponentConfig)
		}
	}}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if vs, ok := st.(*valkey.Store); ok {
		waitValkey(sctx, vs, srv.Health(), log, desc, s.FailurePolicy.String())
	}
	watchDone := make(chan struct{})
	var background sync.WaitGroup
	configFrom := s.DirOptions().Dir()
	if s.BudgetMapPath != "" {
		// Before the first config, so no counter is ever keyed without it.
		if err := startBudgetMap(sctx, s, applier, &background); err != nil {
			return err
		}
	}
	if s.ConfigType == "GRPC_XDS_SOTW" && s.ConfigDir != "" {
		// agentgateway's domains come from files, merged with EG's xDS config.
		if err := startExtraFiles(sctx, s, applier, &background); err != nil {
			return err
		}
	}
	if s.ConfigType == "GRPC_XDS_SOTW" {
		xc, err := newXDSClient(s, applier, log)
		if err != nil {
			return err
		}
		go func() { _ = xc.Run(sctx); close(watchDone) }()
		if err := waitFirstXDSConfig(sctx, s, xc); err != nil {
			cancel()
			<-watchDone
			return err
		}
		configFrom = "xds " + s.XDSServerURL
	} else {
		files := &source.Files{Dir: s.DirOptions(), Interval: s.ConfigPollInterval}
		if err := files.Load(applier); err != nil && !s.ForceStartWithoutInitialConfig {
			return fmt.Errorf("initial config: %w", err)
		}
		go func() { _ = files.Run(sctx, applier); close(watchDone) }()
	}
	g, h, d, mt := srv.Addrs()
	startup.Info("listening", "version", buildinfo.Read().Version, "log_level", s.LogLevel, "grpc", addrString(g), "http", addrString(h), "debug", addrString(d), "metrics", addrString(mt), "config", configFrom, "grpc_tls", serverTLS != nil, "json", jsonState(disableJSON, httpTLS))
	if ready != nil {
		ready(srv)
	}
	noted := make(chan struct{})
	stopNote := context.AfterFunc(ctx, func() {
		log.Info("shutting down: not ready, draining in-flight calls", "drain_limit", shutdownDrain.String())
		close(noted)
	})
	err = srv.Serve(sctx, shutdownDrain)
	if !stopNote() {
		<-noted // logged before "stopped"
	}
	cancel()
	<-watchDone
	background.Wait()
	logStopped(log, err)
	return err
}

// shutdownDrain bounds how long in-flight calls may finish at shutdown.
const shutdownDrain = 5 * time.Second

// logStopped logs the end of Serve: a clean stop (a signal) is INFO, a
// listener failure ERROR. Closing the engine and the store follows (their
// own errors are logged by Run's deferred calls).
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
func startSnapshots(s settings.Settings, ms *memory.Store, lm *ledger.Memory, log, startup *slog.Logger) (stop func(), err error) {
	sn := &memory.Snapshotter{Path: s.MemorySnapshotPath, Store: ms, Interval: s.MemorySnapshotInterval, Logger: log}
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
	// Write once now, so an unwritable place stops the start instead of
	// losing the budgets at the first restart.
	if err := sn.Write(); err != nil {
		release()
		return nil, fmt.Errorf("memory snapshot %s: %w (set MEMORY_SNAPSHOT_PATH to a writable file, or to off to keep no state)", s.MemorySnapshotPath, err)
	}
	startup.Info("embedded store: state kept in the memory snapshot (MEMORY_SNAPSHOT_PATH; off keeps none)", "path", s.MemorySnapshotPath, "counters", rs.Counters, "ledger_hashes", rs.Hashes,
		"expired_counters", rs.ExpiredCounters, "expired_ledger_hashes", rs.ExpiredHashes, "over_bound", rs.OverBound, "interval", s.MemorySnapshotInterval.String())
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

// openStore opens the counter store; with the embedded store it also
// returns the in-process ledger it holds.
func openStore(s settings.Settings, log *slog.Logger) (store.Store, *ledger.Memory, string, error) {
	if s.UseMemoryStore() {
		lm := ledger.NewMemory(s.CacheKeyPrefix, nil)
		return memory.New(memory.Options{MaxCounters: s.MemoryMaxCounters, Ledger: lm, Grace: s.Grace, FullPolicy: s.MemoryFullPolicy}), lm, "memory (embedded; no REDIS_URL set: counters are local to this replica)", nil
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
