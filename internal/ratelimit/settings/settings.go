// Package settings reads the rate limit service's settings once, from the
// environment variables envoyproxy/ratelimit reads (the ones Envoy Gateway
// sets, with the same defaults and ports) and from flags, which win. The
// result is one validated struct passed down; nothing else reads the
// environment.
package settings

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
)

// Settings is the whole service configuration. Defaults are the reference's.
type Settings struct {
	// Listeners: HOST/PORT (0.0.0.0:8080, /healthcheck and /json),
	// GRPC_HOST/GRPC_PORT (0.0.0.0:8081), DEBUG_HOST/DEBUG_PORT
	// (127.0.0.1:6070; the reference binds 0.0.0.0, but pprof and /ledger/
	// must not be reachable by default: set DEBUG_HOST=0.0.0.0 to expose it).
	Host      string
	Port      int
	GRPCHost  string
	GRPCPort  int
	DebugHost string
	DebugPort int
	// HTTPJSON (HTTP_JSON, ours: auto|true|false; default auto) serves
	// /json on the HTTP port. auto: only when the gRPC port does not require
	// client certificates, so /json is never a way around mTLS. true with
	// mTLS: the HTTP port serves TLS and /json answers only verified client
	// certificates (/healthcheck stays open). docs/security.md.
	HTTPJSON string
	// GRPCMaxConnectionAge(Grace): GRPC_MAX_CONNECTION_AGE (24h), _GRACE (1h).
	GRPCMaxConnectionAge      time.Duration
	GRPCMaxConnectionAgeGrace time.Duration
	// GRPCServerUseTLS (GRPC_SERVER_USE_TLS) and its files; wiring them is
	// left to the TLS work (server.Options.TLS takes the *tls.Config).
	GRPCServerUseTLS    bool
	GRPCServerTLSCert   string
	GRPCServerTLSKey    string
	GRPCClientTLSCACert string
	GRPCClientTLSSAN    string

	// Metrics: USE_PROMETHEUS (false), PROMETHEUS_ADDR (:9090), PROMETHEUS_PATH (/metrics).
	UsePrometheus  bool
	PrometheusAddr string
	PrometheusPath string

	// Logging: LOG_LEVEL (INFO; the reference's default is WARN, but
	// start-up, config loads, shutdown and store recoveries are logged at
	// INFO, and Envoy Gateway sets info), LOG_FORMAT (text|json).
	LogLevel  string
	LogFormat string
	// BudgetUsageTopPrincipals (BUDGET_USAGE_TOP_PRINCIPALS, ours; 5,
	// within [0, 100]; 0 turns the gauge off) is how many principals per
	// budget ratelimit_budget_usage_ratio reports: the highest usage ratios,
	// ranked, never named.
	BudgetUsageTopPrincipals int

	// Config source: CONFIG_TYPE (FILE|GRPC_XDS_SOTW).
	ConfigType string
	// Runtime directory (FILE): RUNTIME_ROOT (/srv/runtime_data/current),
	// RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY (config),
	// RUNTIME_IGNOREDOTFILES (false), RUNTIME_WATCH_ROOT (true; polling sees
	// both layouts the same way). ConfigDir (--config-dir) replaces the three
	// path parts with one directory.
	RuntimeRoot           string
	RuntimeSubdirectory   string
	RuntimeAppDirectory   string
	RuntimeIgnoreDotFiles bool
	RuntimeWatchRoot      bool
	ConfigDir             string
	// BudgetMapPath (BUDGET_MAP_PATH, --budget-map), when set, is the budget
	// map budgetgen render wrote: the limits it names count a budget's
	// principal in one counter across Gateways. Polled like the config files.
	BudgetMapPath string
	// ConfigPollInterval (CONFIG_POLL_INTERVAL, 1s) between directory reads.
	ConfigPollInterval time.Duration
	// xDS (GRPC_XDS_SOTW): CONFIG_GRPC_XDS_SERVER_URL (localhost:18000),
	// CONFIG_GRPC_XDS_NODE_ID (default), and TLS files.
	XDSServerURL       string
	XDSNodeID          string
	XDSServerUseTLS    bool
	XDSClientTLSCert   string
	XDSClientTLSKey    string
	XDSServerTLSCACert string
	XDSServerTLSSAN    string
	// XDSClientMaxMsgSize (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES) bounds one
	// xDS response; 0 keeps the client's default (16 MiB).
	XDSClientMaxMsgSize int
	// ForceStartWithoutInitialConfig (FORCE_START_WITHOUT_INITIAL_CONFIG):
	// start even if the first config load fails.
	ForceStartWithoutInitialConfig bool
	// HealthyWithAtLeastOneConfigLoaded (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
	HealthyWithAtLeastOneConfigLoaded bool

	// Store. RedisURL empty (REDIS_URL unset) means the embedded memory store.
	RedisSocketType                  string // REDIS_SOCKET_TYPE: tcp (unix is not supported); empty: tcp for a host:port REDIS_URL
	RedisURL                         string // REDIS_URL: host:port, or a comma list (cluster seeds; sentinel: master,s1,s2)
	RedisType                        string // REDIS_TYPE: single|cluster|sentinel (case-insensitive)
	RedisAuth                        string // REDIS_AUTH: password or user:password. Never logged.
	RedisSentinelAuth                string // REDIS_SENTINEL_AUTH. Never logged.
	RedisTLS                         bool   // REDIS_TLS
	RedisTLSClientCert               string
	RedisTLSClientKey                string
	RedisTLSCACert                   string
	RedisTLSSkipHostnameVerification bool
	// RedisAuthFile and RedisSentinelAuthFile (REDIS_AUTH_FILE,
	// REDIS_SENTINEL_AUTH_FILE, ours) name files holding the same values
	// (a mounted Kubernetes secret), read at start; one trailing newline is
	// dropped. Each excludes its env variant.
	RedisAuthFile         string
	RedisSentinelAuthFile string
	// RedisTimeout (REDIS_TIMEOUT, 10s) bounds connecting.
	RedisTimeout time.Duration
	// ValkeyMaxFlushDelay (VALKEY_MAX_FLUSH_DELAY, ours; 50us) lets the
	// auto-pipeline gather concurrent calls into one write: fewer syscalls,
	// at most that much added latency.
	ValkeyMaxFlushDelay time.Duration
	// ValkeyPipelineMultiplex (VALKEY_PIPELINE_MULTIPLEX, ours; 0 = the
	// store's default): 2^n connections per node.
	ValkeyPipelineMultiplex int
	// ValkeyIdempotencyWindow (VALKEY_IDEMPOTENCY_WINDOW, ours; 0 = the
	// store's default of 1m) is how long a call's id is kept in Valkey, and
	// so how long an ambiguous charge may be replayed; within [1s, 1h].
	ValkeyIdempotencyWindow time.Duration
	// ValkeyBufferMaxBytes (VALKEY_BUFFER_MAX_BYTES, ours; 0 = the store's
	// default of 64 MiB) bounds the memory of the Valkey store's outage
	// buffer (the keys and ledger fields it keeps, plus about 184 bytes
	// each), beside its fixed bound of 100,000 entries; within
	// [MinBufferMaxBytes, MaxBufferMaxBytes] (values.go).
	ValkeyBufferMaxBytes int

	// GRPCStreamWorkers (GRPC_STREAM_WORKERS, ours; 128) reuse goroutines
	// across calls instead of one new goroutine (and stack growth) per call.
	// The lean transport starts an uncompressed ShouldRateLimit call on its
	// connection's read loop instead (nothing there waits for the store).
	GRPCStreamWorkers int
	// GRPCServerImpl (GRPC_SERVER_IMPL, ours; lean) picks the gRPC server:
	// lean (unarygrpc) or grpc-go (the reference's), switchable without a
	// new image.
	GRPCServerImpl string
	// GRPCMaxConnections (GRPC_MAX_CONNECTIONS, ours; default
	// DefaultGRPCMaxConnections, 8192; an explicit 0 = no cap) caps the
	// gRPC port's open connections: one over it is closed at accept,
	// counted and logged at most once per 10 s.
	GRPCMaxConnections int
	// GRPCIdleTimeout (GRPC_IDLE_TIMEOUT, ours; 0 = never) closes gRPC
	// connections without a call for that long (GOAWAY first, so clients
	// reconnect transparently) and idle HTTP keep-alive connections (2m
	// when 0).
	GRPCIdleTimeout time.Duration
	// ShutdownDelay (SHUTDOWN_DELAY, ours; auto: DefaultKubernetesShutdownDelay
	// when KUBERNETES_SERVICE_HOST is set, else 0; within [0, 2m]) is how long
	// the service keeps serving after SIGTERM, readiness failing, before its
	// listeners close and in-flight calls drain: the time a pod's removal
	// from the Service's endpoints takes to reach kube-proxy, Envoy and
	// agentgateway, which would otherwise send calls to a closed port and,
	// failing open, let them through uncounted. A second SIGTERM or SIGINT
	// skips the rest (cmd/ratelimit). Load resolves auto.
	ShutdownDelay time.Duration
	// StoreBatchWorkers (STORE_BATCH_WORKERS, ours; 4) coalesce concurrent
	// requests' store calls; -1 sends one store call per request.
	StoreBatchWorkers int
	// GCPercent (GOGC-like, ours via GC_PERCENT; 400) trades a little memory
	// for less GC CPU on this small-heap service; GOGC, when set, wins.
	GCPercent int
	// MemoryLimitRatio (MEMORY_LIMIT_RATIO, ours; 0.9) sets the Go soft
	// memory limit to this share of the container's cgroup memory limit
	// when GOMEMLIMIT is unset, so the collector runs harder before the
	// kernel's OOM killer would: GC_PERCENT=400 otherwise lets the heap
	// grow to five times the live counters. 0 leaves the runtime alone.
	MemoryLimitRatio float32

	// Decisions.
	CacheKeyPrefix string               // CACHE_KEY_PREFIX
	KeyFormat      key.Format           // KEY_FORMAT safe|envoy (ours; default safe)
	NearLimitRatio float32              // NEAR_LIMIT_RATIO (0.8)
	ShadowMode     bool                 // SHADOW_MODE
	FailurePolicy  decide.FailurePolicy // FAILURE_POLICY allow|deny|error (ours; default allow)
	StoreTimeout   time.Duration        // STORE_TIMEOUT (ours; 15ms)
	// Grace after the window end before a counter expires:
	// EXPIRATION_JITTER_MAX_SECONDS (300) as seconds.
	Grace time.Duration
	// WindowMode (WINDOW_MODE, ours; calendar) places counters in time:
	// calendar windows (a month from the 1st, an ISO week from Monday) or the
	// reference's epoch windows (a 30-day month, a Thursday week).
	// USE_CALENDAR_MONTH_RATE_LIMIT, the reference's opt-in calendar month
	// (envoyproxy/ratelimit#1206), is accepted as an alias: true means
	// calendar, false epoch; it conflicts with a different WINDOW_MODE.
	WindowMode window.Mode
	// ResetTimeZone (RESET_TIME_ZONE, ours; UTC) is the IANA zone of calendar
	// day, week, month and year windows. Not allowed with epoch windows.
	ResetTimeZone string
	// OverLimitCacheSize (OVER_LIMIT_CACHE_SIZE, ours; 100000 entries, -1 off).
	OverLimitCacheSize int
	// MemoryMaxCounters (MEMORY_MAX_COUNTERS, ours; 0 = the memory store's
	// default of 1,000,000) bounds the embedded store's live counters; at
	// the bound a call needing a new counter gets the failure policy.
	MemoryMaxCounters int
	// MemoryMaxBytes (MEMORY_MAX_BYTES, ours; 0 = DefaultMemoryMaxBytes, 256
	// MiB, or half the Go soft memory limit the service sets from the
	// container's when that is lower) bounds the bytes of the embedded
	// store's live counters: their keys (a descriptor value is up to 8 KiB)
	// plus memory.CounterOverhead each; at the bound, as at
	// MEMORY_MAX_COUNTERS.
	MemoryMaxBytes int
	// MemoryFullPolicy (MEMORY_FULL_POLICY, ours; deny) is what a request
	// needing a new counter gets when the embedded store is at
	// MEMORY_MAX_COUNTERS or MEMORY_MAX_BYTES (after counters of ended
	// windows are reclaimed):
	// deny (OVER_LIMIT, whatever FAILURE_POLICY: the bound still enforces)
	// or failure-policy (FAILURE_POLICY answers; allow lets it through
	// uncounted).
	MemoryFullPolicy MemoryFullPolicy
	// MemorySnapshotPath (MEMORY_SNAPSHOT_PATH, ours; default
	// DefaultSnapshotPath, "off" = none) is a file the embedded store's
	// counters, holds and usage ledger are written to every
	// MemorySnapshotInterval and at shutdown, atomically, and restored from
	// at start (windows that ended are dropped; a corrupt file stops the
	// start with an error naming it). A crash loses at most one interval.
	// Load resolves the default; after Load, empty means off.
	MemorySnapshotPath string
	// MemorySnapshotInterval (MEMORY_SNAPSHOT_INTERVAL, ours; 10s, within
	// [100ms, 1h]).
	MemorySnapshotInterval time.Duration
	// ReservationExpiry (RESERVATION_EXPIRY, ours; 10m, within [1s, 24h])
	// is how long a reserving budget's hold outlives a request whose charge
	// never comes (an upstream error, a lost stream-done call).
	ReservationExpiry time.Duration
	// LedgerRetentionDays (LEDGER_RETENTION_DAYS, ours; default 10, within
	// [8, 92]) keeps each day of shadow-week measurements (internal/ledger) this
	// many days after it ends.
	LedgerRetentionDays int
	// ThresholdEventsURL (THRESHOLD_EVENTS_URL, ours; default empty = off)
	// receives a POST of a CloudEvent per 80/90/100% threshold crossing
	// (internal/eventsink). It may carry a token: never logged.
	ThresholdEventsURL string

	// Redis is RedisURL and RedisType parsed (by Load, once; see ParseRedis).
	Redis RedisTarget

	// Unsupported lists reference settings that are set but have no effect
	// here, one human-readable line each (values never included), sorted.
	Unsupported []string
}

// DefaultGRPCMaxConnections is GRPC_MAX_CONNECTIONS when unset: each
// connection may hold its bounded bytes (docs/security.md), so without a
// cap memory has no bound in total. Envoy opens about one connection per
// worker thread to each rate limit replica it calls (its default is a
// worker per hardware thread): 8192 is 256 Envoy pods of 32 workers (or
// 1,024 of 8) all calling one replica, more than a real Envoy Gateway or
// agentgateway fleet reaches; 8192 idle connections hold about 400 MiB (an
// idle lean connection measured under 50 KiB of heap and stacks,
// runtime.MemStats over 400 connections).
const DefaultGRPCMaxConnections = 8192

// Defaults returns the reference's defaults plus ours.
func Defaults() Settings {
	return Settings{
		Host: "0.0.0.0", Port: 8080, GRPCHost: "0.0.0.0", GRPCPort: 8081, DebugHost: "127.0.0.1", DebugPort: 6070, HTTPJSON: HTTPJSONAuto,
		GRPCMaxConnectionAge: 24 * time.Hour, GRPCMaxConnectionAgeGrace: time.Hour,
		PrometheusAddr: ":9090", PrometheusPath: "/metrics",
		LogLevel: "INFO", LogFormat: "text", BudgetUsageTopPrincipals: defaultTopPrincipals,
		ConfigType:  "FILE",
		RuntimeRoot: "/srv/runtime_data/current", RuntimeAppDirectory: "config", RuntimeWatchRoot: true,
		ConfigPollInterval: time.Second,
		XDSServerURL:       "localhost:18000", XDSNodeID: "default",
		RedisType: "SINGLE", RedisTimeout: 10 * time.Second,
		ValkeyMaxFlushDelay: 50 * time.Microsecond, GRPCStreamWorkers: 128, GRPCServerImpl: "lean", GRPCMaxConnections: DefaultGRPCMaxConnections, GCPercent: 400, MemoryLimitRatio: 0.9, StoreBatchWorkers: defaultStoreBatchWorkers,
		NearLimitRatio: decide.DefaultNearLimitRatio, StoreTimeout: defaultStoreTimeout,
		Grace: 300 * time.Second, OverLimitCacheSize: defaultOverLimitCacheSize,
		LedgerRetentionDays: defaultRetentionDays, MemorySnapshotInterval: defaultSnapshotInterval,
		ReservationExpiry: defaultReservationExpiry,
	}
}

// HTTP_JSON values.
const (
	HTTPJSONAuto  = "auto"
	HTTPJSONTrue  = "true"
	HTTPJSONFalse = "false"
)

// GRPCAddr, HTTPAddr and DebugAddr join host and port.
func (s Settings) GRPCAddr() string  { return net.JoinHostPort(s.GRPCHost, strconv.Itoa(s.GRPCPort)) }
func (s Settings) HTTPAddr() string  { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }
func (s Settings) DebugAddr() string { return net.JoinHostPort(s.DebugHost, strconv.Itoa(s.DebugPort)) }

// DirOptions is where FILE configs are read from.
func (s Settings) DirOptions() config.DirOptions {
	if s.ConfigDir != "" {
		return config.DirOptions{Root: s.ConfigDir, IgnoreDotFiles: s.RuntimeIgnoreDotFiles}
	}
	return config.DirOptions{Root: s.RuntimeRoot, Subdirectory: s.RuntimeSubdirectory,
		AppDirectory: s.RuntimeAppDirectory, IgnoreDotFiles: s.RuntimeIgnoreDotFiles}
}

// UseMemoryStore reports whether no Valkey address is configured.
func (s Settings) UseMemoryStore() bool { return s.RedisURL == "" }

// RedisCredentials splits REDIS_AUTH the way the reference does ("user:pass"
// or a bare password).
func RedisCredentials(auth string) (user, pass string) {
	if u, p, ok := strings.Cut(auth, ":"); ok {
		return u, p
	}
	return "", auth
}

// unsupported are reference settings with no effect here, and why. A setting
// is reported when set to a value that would change the reference's behaviour.
var unsupported = []struct {
	name, reason string
	neutral      []string // values that change nothing (reported as fine)
}{
	{"USE_STATSD", "statsd is not supported; use USE_PROMETHEUS", []string{"false", "0"}},
	{"USE_DOG_STATSD", "dogstatsd is not supported; use USE_PROMETHEUS", []string{"false", "0"}},
	{"STATSD_HOST", "statsd is not supported", nil},
	{"STATSD_PORT", "statsd is not supported", nil},
	{"EXTRA_TAGS", "statsd tags are not supported", nil},
	{"STATS_FLUSH_INTERVAL", "statsd is not supported", nil},
	{"DISABLE_STATS", "metrics are always on (Prometheus)", []string{"false", "0"}},
	{"PROMETHEUS_MAPPER_YAML", "metric names are fixed", nil},
	{"GRPC_UDS", "unix-socket gRPC is not supported", nil},
	{"BACKEND_TYPE", "only the redis/valkey and embedded memory stores exist", []string{"redis"}},
	{"MEMCACHE_HOST_PORT", "memcached is not supported", nil},
	{"MEMCACHE_SRV", "memcached is not supported", nil},
	{"REDIS_PERSECOND", "a separate per-second Redis is not supported", []string{"false", "0"}},
	{"REDIS_PERSECOND_URL", "a separate per-second Redis is not supported", nil},
	{"REDIS_POOL_SIZE", "valkey-go auto-pipelines over a few connections; no pool", nil},
	{"REDIS_PIPELINE_WINDOW", "valkey-go auto-pipelines; no window", nil},
	{"REDIS_PIPELINE_LIMIT", "valkey-go auto-pipelines; no limit", nil},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "no pool", nil},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "not supported", []string{"false", "0"}},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "the over-limit cache is always on, bounded by OVER_LIMIT_CACHE_SIZE entries and 32 MiB", []string{"0"}},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "over-limit hits are always charged, as by default in the reference", []string{"false", "0"}},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "rate limit response headers are not added", []string{"false", "0"}},
	{"RESPONSE_DYNAMIC_METADATA", "response dynamic metadata is not added", []string{"false", "0"}},
	{"QUOTA_MODE", "global quota mode is not supported (per-descriptor quota_mode is)", []string{"false", "0"}},
	{"MERGE_DOMAIN_CONFIG", "domains split over several files are rejected", []string{"false", "0"}},
	{"TRACING_ENABLED", "tracing is not supported", []string{"false", "0"}},
	{"CONFIG_GRPC_XDS_NODE_METADATA", "not supported yet", nil},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "not supported yet", nil},
	{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "the xDS client reconnects with a fixed backoff: 0.5 s doubling to 30 s, with jitter", nil},
	{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "the xDS client reconnects with a fixed backoff: 0.5 s doubling to 30 s, with jitter", nil},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "the xDS client reconnects with a fixed backoff: 0.5 s doubling to 30 s, with jitter", nil},
	{"XDS_CLIENT_BACKOFF_JITTER", "the xDS client always adds jitter to its reconnect backoff", []string{"true", "1"}},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "the xDS client reconnects with a fixed backoff: 0.5 s doubling to 30 s, with jitter", nil},
}

// Description heads --help: what the service is and how it is configured.
const Description = `ratelimit: budgetgen's rate limit service, a drop-in for envoyproxy/ratelimit.
It answers Envoy's envoy.service.ratelimit.v3 ShouldRateLimit over gRPC (and
/json over HTTP), counts in fixed windows (calendar days in UTC by default) in
Valkey (REDIS_URL) or, without it, in an embedded memory store, and records the
per-principal daily usage the shadow week's budgetgen report reads.

Usage: ratelimit [flags]

Every setting is read from its environment variables (the reference's names
where it has one: RUNTIME_ROOT, CONFIG_TYPE=GRPC_XDS_SOTW as Envoy Gateway
sets it, REDIS_URL, ...) and, where one is listed, its flag, which wins.
--version prints the version, commit and Go version. docs/settings.md holds
the same list.
`

// Load reads getenv, then args (flags win), validates and returns the
// settings. usage receives flag errors and -help output. Every setting is
// named once, in table (table.go): environment variables, flag, doc.
func Load(args []string, getenv func(string) string, usage io.Writer) (Settings, error) {
	s := Defaults()
	var errs []error
	env := func(name string) (string, bool) {
		v := getenv(name)
		return v, v != ""
	}
	r := newRaw(s)
	settings := table(&s, &r)
	for _, st := range settings {
		for _, name := range st.env {
			if v, ok := env(name); ok {
				if err := st.v.Set(v); err != nil {
					errs = append(errs, fmt.Errorf("%s: %v: %q", name, err, v))
				}
			}
		}
	}
	fs := flag.NewFlagSet("ratelimit", flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.Usage = func() {
		_ = WriteHelp(usage) // flag.Usage has no error result
	}
	for _, st := range settings {
		if st.flag != "" {
			fs.Var(st.v, st.flag, st.help())
		}
	}
	// The reference's alias of WINDOW_MODE: whether it is set matters, so it
	// is read apart from the table (parseWindowMode).
	calendarMonth, calendarMonthSet := env("USE_CALENDAR_MONTH_RATE_LIMIT")
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments: %q", fs.Args()))
	}
	s.Grace = time.Duration(r.jitter) * time.Second
	var err error
	if s.KeyFormat, err = key.ParseFormat(strings.ToLower(r.keyFormat)); err != nil {
		errs = append(errs, fmt.Errorf("KEY_FORMAT: %w", err))
	}
	if s.FailurePolicy, err = decide.ParseFailurePolicy(strings.ToLower(r.policy)); err != nil {
		errs = append(errs, fmt.Errorf("FAILURE_POLICY: %w", err))
	}
	if err := s.parseWindowMode(r.windowMode, calendarMonth, calendarMonthSet); err != nil {
		errs = append(errs, err)
	}
	if s.MemoryFullPolicy, err = parseMemoryFullPolicy(strings.ToLower(strings.TrimSpace(r.fullPolicy))); err != nil {
		errs = append(errs, fmt.Errorf("MEMORY_FULL_POLICY: %w", err))
	}
	if s.ShutdownDelay, err = parseShutdownDelay(r.shutdownDelay, getenv); err != nil {
		errs = append(errs, err)
	}
	for _, u := range unsupported {
		v, ok := env(u.name)
		if !ok {
			continue
		}
		neutral := false
		for _, n := range u.neutral {
			neutral = neutral || strings.EqualFold(strings.TrimSpace(v), n)
		}
		if !neutral {
			s.Unsupported = append(s.Unsupported, u.name+" is set but ignored: "+u.reason)
		}
	}
	if s.GRPCClientTLSSAN != "" && s.GRPCClientTLSCACert == "" {
		// As in the reference: no CA, no client certificate asked for, so
		// no name to check. Said, so nobody believes the callers narrowed.
		s.Unsupported = append(s.Unsupported, "GRPC_CLIENT_TLS_SAN is set but ignored: it needs GRPC_CLIENT_TLS_CACERT (no client certificate is asked for without a CA)")
	}
	sort.Strings(s.Unsupported)
	s.MemorySnapshotPath = snapshotPath(s.MemorySnapshotPath, s.UseMemoryStore(), getenv, s.GRPCPort)
	errs = append(errs, s.Validate())
	if s.RedisURL != "" {
		s.Redis, _ = ParseRedis(s.RedisURL, s.RedisType) // its errors are Validate's
	}
	return s, errors.Join(errs...)
}

// SnapshotOff is the MEMORY_SNAPSHOT_PATH that turns the embedded store's
// snapshots off.
const SnapshotOff = "off"

// DefaultSnapshotPath is where the embedded store keeps its snapshot when
// MEMORY_SNAPSHOT_PATH is unset: ratelimit-memory-<gRPC port>.snapshot (the
// port tells two services on one host apart) in $XDG_STATE_HOME/budgetgen/
// (the container image sets XDG_STATE_HOME=/var/lib), else
// $HOME/.local/state/budgetgen/ (a plain `go run`), else budgetgen-<uid>/
// in the temporary directory: a directory of this user's own (created 0700
// by the snapshot's Claim), never a file right in a directory every user
// can write to, where another user could put a link or a file of theirs.
func DefaultSnapshotPath(getenv func(string) string, grpcPort int) string {
	file := "ratelimit-memory-" + strconv.Itoa(grpcPort) + ".snapshot"
	switch {
	case getenv("XDG_STATE_HOME") != "":
		return filepath.Join(getenv("XDG_STATE_HOME"), "budgetgen", file)
	case getenv("HOME") != "":
		return filepath.Join(getenv("HOME"), ".local", "state", "budgetgen", file)
	}
	return filepath.Join(os.TempDir(), "budgetgen-"+strconv.Itoa(os.Getuid()), file)
}

// snapshotPath resolves MEMORY_SNAPSHOT_PATH: the default for the embedded
// store when unset, none when "off" (or with Valkey, which keeps the state).
func snapshotPath(set string, memoryStore bool, getenv func(string) string, grpcPort int) string {
	switch {
	case strings.EqualFold(set, SnapshotOff):
		return ""
	case set == "" && memoryStore:
		return DefaultSnapshotPath(getenv, grpcPort)
	}
	return set
}

// newRaw is the raw text of the settings parsed after Load, at s's values
// (SHUTDOWN_DELAY's default is auto, resolved by Load).
func newRaw(s Settings) raw {
	return raw{keyFormat: s.KeyFormat.String(), policy: s.FailurePolicy.String(), fullPolicy: s.MemoryFullPolicy.String(), jitter: int(s.Grace / time.Second),
		shutdownDelay: ShutdownDelayAuto}
}

// SHUTDOWN_DELAY: its default, and what auto means in a pod.
const (
	ShutdownDelayAuto = "auto"
	// DefaultKubernetesShutdownDelay is SHUTDOWN_DELAY=auto in a pod. When a
	// pod is deleted, its endpoint is marked terminating at once, but
	// kube-proxy's rules, Envoy's and agentgateway's endpoint lists follow a
	// few seconds later; Envoy Gateway gives its own Envoy proxies the same
	// 10s for that (ShutdownConfig.MinDrainDuration, api/v1alpha1/envoyproxy_types.go
	// of github.com/envoyproxy/gateway v1.9.1). Outside a pod nobody routes by
	// endpoints, and a local run or a test stops at once.
	DefaultKubernetesShutdownDelay = 10 * time.Second
	// MaxShutdownDelay bounds SHUTDOWN_DELAY: with the drain and the stores'
	// close it must fit a pod's terminationGracePeriodSeconds (Envoy
	// Gateway's rate limit Deployment: 300 s; the chart's: its value).
	MaxShutdownDelay = 2 * time.Minute
)

// parseShutdownDelay resolves SHUTDOWN_DELAY: auto is
// DefaultKubernetesShutdownDelay when KUBERNETES_SERVICE_HOST is set (the
// kubelet sets it in every container), else 0.
func parseShutdownDelay(v string, getenv func(string) string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if strings.EqualFold(v, ShutdownDelayAuto) {
		if getenv("KUBERNETES_SERVICE_HOST") != "" {
			return DefaultKubernetesShutdownDelay, nil
		}
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("SHUTDOWN_DELAY: not a duration or auto: %q", v)
	}
	if d < 0 || d > MaxShutdownDelay {
		return 0, fmt.Errorf("SHUTDOWN_DELAY: %v not in [0s,%v]", d, MaxShutdownDelay)
	}
	return d, nil
}

// parseWindowMode sets WindowMode from WINDOW_MODE and the reference's
// USE_CALENDAR_MONTH_RATE_LIMIT alias.
func (s *Settings) parseWindowMode(mode, calendarMonth string, calendarMonthSet bool) error {
	m, err := window.ParseMode(mode)
	if err != nil {
		return fmt.Errorf("WINDOW_MODE: %w", err)
	}
	s.WindowMode = m
	if !calendarMonthSet {
		return nil
	}
	b, err := strconv.ParseBool(strings.TrimSpace(calendarMonth))
	if err != nil {
		return fmt.Errorf("USE_CALENDAR_MONTH_RATE_LIMIT: not a boolean: %q", calendarMonth)
	}
	alias := window.Epoch
	if b {
		alias = window.Calendar
	}
	if mode != "" && alias != m {
		return fmt.Errorf("USE_CALENDAR_MONTH_RATE_LIMIT=%t conflicts with WINDOW_MODE=%s; set one", b, m)
	}
	s.WindowMode = alias
	return nil
}

// Windows returns the counter windows the settings ask for.
func (s Settings) Windows() (window.Windows, error) {
	o := window.Options{Mode: s.WindowMode}
	if s.ResetTimeZone != "" {
		if s.WindowMode == window.Epoch {
			return window.Windows{}, fmt.Errorf("RESET_TIME_ZONE: %q needs calendar windows; epoch windows (WINDOW_MODE=epoch) have no time zone", s.ResetTimeZone)
		}
		loc, err := time.LoadLocation(s.ResetTimeZone)
		if err != nil || s.ResetTimeZone == "Local" {
			return window.Windows{}, fmt.Errorf("RESET_TIME_ZONE: %q is not an IANA time zone name (e.g. Europe/Paris)", s.ResetTimeZone)
		}
		o.Location = loc
	}
	return window.New(o)
}

// Validate checks values and combinations, by the concerns --help groups
// them in (doc.go). Errors name the setting as the table binds it.
func (s Settings) Validate() error {
	return errors.Join(s.validateServer(), s.validateDecisions(), s.validateStore(),
		s.validateObservability(), s.validateConfigSource())
}

// validateServer checks the listeners, the gRPC server and the Go runtime.
func (s *Settings) validateServer() error {
	var errs []error
	name := s.envName
	for _, p := range []*int{&s.Port, &s.GRPCPort, &s.DebugPort} {
		if *p < 0 || *p > 65535 {
			errs = append(errs, fmt.Errorf("%s: %d is not a port", name(p), *p))
		}
	}
	if s.MemoryLimitRatio < 0 || s.MemoryLimitRatio > 1 {
		errs = append(errs, fmt.Errorf("%s: %v not in [0,1]", name(&s.MemoryLimitRatio), s.MemoryLimitRatio))
	}
	if s.GRPCStreamWorkers < 0 || s.GRPCStreamWorkers > 65536 {
		errs = append(errs, fmt.Errorf("%s: %d not in [0,65536]", name(&s.GRPCStreamWorkers), s.GRPCStreamWorkers))
	}
	if s.GRPCServerImpl != "lean" && s.GRPCServerImpl != "grpc-go" {
		errs = append(errs, fmt.Errorf("%s: %q is neither lean nor grpc-go", name(&s.GRPCServerImpl), s.GRPCServerImpl))
	}
	if s.GRPCMaxConnections < 0 {
		errs = append(errs, fmt.Errorf("%s: %d must not be negative", name(&s.GRPCMaxConnections), s.GRPCMaxConnections))
	}
	if s.GRPCIdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("%s: %v must not be negative", name(&s.GRPCIdleTimeout), s.GRPCIdleTimeout))
	}
	if s.XDSClientMaxMsgSize < 0 {
		errs = append(errs, fmt.Errorf("%s: %d must not be negative", name(&s.XDSClientMaxMsgSize), s.XDSClientMaxMsgSize))
	}
	switch strings.ToLower(s.HTTPJSON) {
	case HTTPJSONAuto, HTTPJSONTrue, HTTPJSONFalse:
	default:
		errs = append(errs, fmt.Errorf("%s: %q is not auto, true or false", name(&s.HTTPJSON), s.HTTPJSON))
	}
	return errors.Join(errs...)
}

// validateDecisions checks how counters are decided, kept and placed in time.
func (s *Settings) validateDecisions() error {
	var errs []error
	name := s.envName
	if s.NearLimitRatio < 0 || s.NearLimitRatio > 1 {
		errs = append(errs, fmt.Errorf("%s: %v not in [0,1]", name(&s.NearLimitRatio), s.NearLimitRatio))
	}
	if s.StoreTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%s: %v must be positive", name(&s.StoreTimeout), s.StoreTimeout))
	}
	if s.ReservationExpiry < time.Second || s.ReservationExpiry > 24*time.Hour {
		errs = append(errs, fmt.Errorf("%s: %v not in [1s,24h]", name(&s.ReservationExpiry), s.ReservationExpiry))
	}
	if s.Grace < 0 {
		errs = append(errs, errors.New("EXPIRATION_JITTER_MAX_SECONDS: must not be negative")) // Grace is parsed from raw.jitter, which envName cannot see
	}
	if _, err := s.Windows(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validateStore checks the Valkey and the embedded store's settings. The
// values of REDIS_URL and the secrets are never echoed.
func (s *Settings) validateStore() error {
	var errs []error
	name := s.envName
	if s.ValkeyMaxFlushDelay < 0 || s.ValkeyMaxFlushDelay > 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("%s: %v not in [0,10ms]", name(&s.ValkeyMaxFlushDelay), s.ValkeyMaxFlushDelay))
	}
	if w := s.ValkeyIdempotencyWindow; w != 0 && (w < time.Second || w > time.Hour) {
		errs = append(errs, fmt.Errorf("%s: %v not in [1s,1h]", name(&s.ValkeyIdempotencyWindow), w))
	}
	if n := s.ValkeyBufferMaxBytes; n != 0 && (n < MinBufferMaxBytes || n > MaxBufferMaxBytes) {
		errs = append(errs, fmt.Errorf("%s: %d bytes not in [%d (1 MiB), %d (4 GiB)]; 0 keeps the store's default (%d, 64 MiB)",
			name(&s.ValkeyBufferMaxBytes), n, MinBufferMaxBytes, MaxBufferMaxBytes, DefaultBufferMaxBytes))
	}
	if s.MemorySnapshotInterval < 100*time.Millisecond || s.MemorySnapshotInterval > time.Hour {
		errs = append(errs, fmt.Errorf("%s: %v not in [100ms,1h]", name(&s.MemorySnapshotInterval), s.MemorySnapshotInterval))
	}
	if s.MemorySnapshotPath != "" && !s.UseMemoryStore() {
		errs = append(errs, fmt.Errorf("%s is for the embedded store; %s is set", name(&s.MemorySnapshotPath), name(&s.RedisURL)))
	}
	if s.MemoryMaxCounters < 0 {
		errs = append(errs, fmt.Errorf("%s: %d must not be negative", name(&s.MemoryMaxCounters), s.MemoryMaxCounters))
	}
	if s.MemoryMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("%s: %d must not be negative", name(&s.MemoryMaxBytes), s.MemoryMaxBytes))
	}
	if s.RedisAuth != "" && s.RedisAuthFile != "" {
		errs = append(errs, fmt.Errorf("%s and %s are both set; set one", name(&s.RedisAuth), name(&s.RedisAuthFile)))
	}
	if s.RedisSentinelAuth != "" && s.RedisSentinelAuthFile != "" {
		errs = append(errs, fmt.Errorf("%s and %s are both set; set one", name(&s.RedisSentinelAuth), name(&s.RedisSentinelAuthFile)))
	}
	if s.RedisURL != "" {
		if err := s.checkSocketType(); err != nil {
			errs = append(errs, err)
		}
		if _, err := ParseRedis(s.RedisURL, s.RedisType); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// validateObservability checks metrics, logs, the ledger and the threshold
// events.
func (s *Settings) validateObservability() error {
	var errs []error
	name := s.envName
	if n := s.BudgetUsageTopPrincipals; n < 0 || n > maxTopPrincipals {
		errs = append(errs, fmt.Errorf("%s: %d not in [0,%d]", name(&s.BudgetUsageTopPrincipals), n, maxTopPrincipals))
	}
	if n := s.LedgerRetentionDays; n < minRetentionDays || n > maxRetentionDays {
		errs = append(errs, fmt.Errorf("%s: %d not in [%d, %d]", name(&s.LedgerRetentionDays), n, minRetentionDays, maxRetentionDays))
	}
	if s.ThresholdEventsURL != "" {
		if u, err := url.Parse(s.ThresholdEventsURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%s: want an absolute http:// or https:// URL", name(&s.ThresholdEventsURL))) // the value may hold a token
		}
	}
	switch strings.ToLower(s.LogLevel) {
	case "debug", "info", "warn", "warning", "error", "fatal", "panic", "trace":
	default:
		errs = append(errs, fmt.Errorf("%s: unknown level %q", name(&s.LogLevel), s.LogLevel))
	}
	switch strings.ToLower(s.LogFormat) {
	case "text", "json":
	default:
		errs = append(errs, fmt.Errorf("%s: %q is not text or json", name(&s.LogFormat), s.LogFormat))
	}
	return errors.Join(errs...)
}

// validateConfigSource checks where rate limit configs come from.
func (s *Settings) validateConfigSource() error {
	switch s.ConfigType {
	case "FILE", "GRPC_XDS_SOTW":
		return nil
	}
	return fmt.Errorf("%s: %q is not FILE or GRPC_XDS_SOTW", s.envName(&s.ConfigType), s.ConfigType)
}

// checkSocketType accepts tcp. The reference defaults REDIS_SOCKET_TYPE to
// unix, so a user who sets only REDIS_URL=host:port would be refused for a
// socket type they never chose; unset, the socket type follows REDIS_URL
// instead: host:port is tcp, a path (the reference's unix socket form) is
// refused. An explicit REDIS_SOCKET_TYPE keeps the reference's meaning. The
// URL is never echoed: it may hold credentials.
func (s *Settings) checkSocketType() error {
	switch t := strings.ToLower(s.RedisSocketType); {
	case t == "tcp":
		return nil
	case t != "":
		return fmt.Errorf("%s: %q is not supported (set tcp; %s is set)", s.envName(&s.RedisSocketType), s.RedisSocketType, s.envName(&s.RedisURL))
	case strings.HasPrefix(s.RedisURL, "/") || strings.HasPrefix(strings.ToLower(s.RedisURL), "unix:"):
		return fmt.Errorf("%s: unset, and %s is a unix socket path, which is not supported (give host:port; %s tcp)", s.envName(&s.RedisSocketType), s.envName(&s.RedisURL), s.envName(&s.RedisSocketType))
	}
	return nil
}

// checkRedisAddr accepts host:port with a numeric port and nothing else: no
// user:password@, no ?password= query, no scheme. Its errors never include
// the address.
func checkRedisAddr(a string) error {
	if strings.ContainsAny(a, "@?/#") {
		return errors.New("holds more than host:port (credentials, a query or a scheme)")
	}
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return errors.New("is not host:port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return errors.New("has no valid port")
	}
	return nil
}
