package settings

import (
	"errors"
	"flag"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/decide"
	"github.com/budgetgen/budgetgen/internal/ratelimit/key"
	"github.com/budgetgen/budgetgen/internal/ratelimit/window"
)

// setting binds one value to its environment variables, its flag and its
// doc, once. Environment variables are read in order (a later one that is
// set wins); the flag, when given, wins over all of them.
type setting struct {
	env  []string
	flag string // "" when the setting has no flag
	doc  string
	v    flag.Value
}

// raw holds settings parsed into Settings fields only after Load has read
// them all (their text form is what env and flags set).
type raw struct {
	keyFormat, policy, fullPolicy, windowMode, shutdownDelay string
	jitter                                                   int
}

// table is every setting of the service, by the concerns --help groups them
// in (doc.go; settings keep this order within a group). Defaults are s's
// current values.
func table(s *Settings, r *raw) []setting {
	return slices.Concat(serverSettings(s, r), configSettings(s), decisionSettings(s, r), storeSettings(s, r), observabilitySettings(s))
}

// vars lists a setting's environment variables.
func vars(names ...string) []string { return names }

// serverSettings are the listeners, the gRPC server and its TLS, the stop,
// and the Go runtime.
func serverSettings(s *Settings, r *raw) []setting {
	return []setting{
		{vars("HOST"), "host", "HTTP listen host", str(&s.Host)},
		{vars("PORT"), "port", "HTTP port for /healthcheck and /json", integer(&s.Port)},
		{vars("GRPC_HOST"), "grpc-host", "gRPC listen host", str(&s.GRPCHost)},
		{vars("GRPC_PORT"), "grpc-port", "gRPC port", integer(&s.GRPCPort)},
		{vars("DEBUG_HOST"), "debug-host", "debug listen host (pprof, ledger; loopback unless exposed on purpose)", str(&s.DebugHost)},
		{vars("HTTP_JSON"), "http-json", "serve /json on the HTTP port: auto (unless gRPC requires client certificates), true or false", str(&s.HTTPJSON)},
		{vars("DEBUG_PORT"), "debug-port", "debug port: an index, /rlconfig, pprof, /metrics and, with the embedded store, /ledger/keys", integer(&s.DebugPort)},
		{vars("GRPC_MAX_CONNECTION_AGE"), "", "gRPC connections are closed after this age", duration(&s.GRPCMaxConnectionAge)},
		{vars("GRPC_MAX_CONNECTION_AGE_GRACE"), "", "grace period for calls on a connection past its age", duration(&s.GRPCMaxConnectionAgeGrace)},
		{vars("GRPC_STREAM_WORKERS"), "grpc-stream-workers", "reusable gRPC stream goroutines, 0 = one per call", integer(&s.GRPCStreamWorkers)},
		{vars("GRPC_SERVER_IMPL"), "grpc-server-impl", "gRPC server: lean or grpc-go", str(&s.GRPCServerImpl)},
		{vars("GRPC_MAX_CONNECTIONS"), "grpc-max-connections", "cap on open gRPC connections (past it, closed at accept, counted in ratelimit_grpc_connections_refused_total, logged at most once per 10s); 0 = none", integer(&s.GRPCMaxConnections)},
		{vars("GRPC_IDLE_TIMEOUT"), "grpc-idle-timeout", "close gRPC connections idle that long, 0 = never", duration(&s.GRPCIdleTimeout)},
		{vars("SHUTDOWN_DELAY"), "shutdown-delay", "after SIGTERM, keep serving this long with readiness failing before closing the listeners and draining, so callers stop picking this pod first; within [0s, 2m]; auto = " + DefaultKubernetesShutdownDelay.String() + " when KUBERNETES_SERVICE_HOST is set (in a pod), else 0s; a second SIGTERM or SIGINT skips the rest", str(&r.shutdownDelay)},
		{vars("GRPC_SERVER_USE_TLS"), "", "serve gRPC over TLS", boolean(&s.GRPCServerUseTLS)},
		{vars("GRPC_SERVER_TLS_CERT"), "", "gRPC server certificate file", str(&s.GRPCServerTLSCert)},
		{vars("GRPC_SERVER_TLS_KEY"), "", "gRPC server key file", str(&s.GRPCServerTLSKey)},
		// GRPC_SERVER_TLS_CA_CERT is the name Envoy Gateway sets; it wins over the reference's.
		{vars("GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT"), "", "CA client certificates must chain to (mTLS)", str(&s.GRPCClientTLSCACert)},
		{vars("GRPC_CLIENT_TLS_SAN"), "", "SAN required in client certificates", str(&s.GRPCClientTLSSAN)},
		{vars("GC_PERCENT"), "", "GOGC when GOGC is unset", integer(&s.GCPercent)},
		{vars("MEMORY_LIMIT_RATIO"), "", "Go soft memory limit as a share of the cgroup memory limit when GOMEMLIMIT is unset, 0 = off", ratio(&s.MemoryLimitRatio)},
	}
}

// configSettings are where rate limit configs come from: files or xDS.
func configSettings(s *Settings) []setting {
	return []setting{
		{vars("CONFIG_TYPE"), "", "where rate limit configs come from: FILE (the runtime directory or CONFIG_DIR) or GRPC_XDS_SOTW (an xDS server, as Envoy Gateway runs it)", str(&s.ConfigType)},
		{vars("CONFIG_DIR"), "config-dir", "directory of rate limit config YAML files (replaces RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY); with CONFIG_TYPE=GRPC_XDS_SOTW its files (agentgateway's domains) are served next to the xDS config", str(&s.ConfigDir)},
		{vars("BUDGET_MAP_PATH"), "budget-map", "budget map file from budgetgen render --budget-map: count each budget's principal once across Gateways (hot-reloaded)", str(&s.BudgetMapPath)},
		{vars("RUNTIME_ROOT"), "", "runtime root directory", str(&s.RuntimeRoot)},
		{vars("RUNTIME_SUBDIRECTORY"), "", "runtime subdirectory", str(&s.RuntimeSubdirectory)},
		{vars("RUNTIME_APPDIRECTORY"), "", "runtime application directory", str(&s.RuntimeAppDirectory)},
		{vars("RUNTIME_IGNOREDOTFILES"), "ignore-dotfiles", "skip config files and directories starting with '.'", boolean(&s.RuntimeIgnoreDotFiles)},
		{vars("RUNTIME_WATCH_ROOT"), "", "watch the runtime root (polling sees both layouts the same way)", boolean(&s.RuntimeWatchRoot)},
		{vars("CONFIG_POLL_INTERVAL"), "config-poll-interval", "how often the config directory is re-read", duration(&s.ConfigPollInterval)},
		{vars("FORCE_START_WITHOUT_INITIAL_CONFIG"), "", "start even if the first config load fails", boolean(&s.ForceStartWithoutInitialConfig)},
		{vars("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"), "", "health fails until a config is loaded", boolean(&s.HealthyWithAtLeastOneConfigLoaded)},
		{vars("CONFIG_GRPC_XDS_SERVER_URL"), "", "xDS server address", str(&s.XDSServerURL)},
		{vars("CONFIG_GRPC_XDS_NODE_ID"), "", "xDS node id", str(&s.XDSNodeID)},
		{vars("CONFIG_GRPC_XDS_SERVER_USE_TLS"), "", "TLS to the xDS server", boolean(&s.XDSServerUseTLS)},
		{vars("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"), "", "xDS client certificate file", str(&s.XDSClientTLSCert)},
		{vars("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"), "", "xDS client key file", str(&s.XDSClientTLSKey)},
		{vars("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"), "", "CA the xDS server's certificate must chain to", str(&s.XDSServerTLSCACert)},
		{vars("CONFIG_GRPC_XDS_SERVER_TLS_SAN"), "", "SAN required in the xDS server's certificate", str(&s.XDSServerTLSSAN)},
		{vars("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"), "", "largest xDS response accepted, in bytes; 0 = 16 MiB (a larger one is reported as a rejected config)", integer(&s.XDSClientMaxMsgSize)},
	}
}

// decisionSettings are how requests are decided and counters kept and placed in time.
func decisionSettings(s *Settings, r *raw) []setting {
	return []setting{
		{vars("STORE_BATCH_WORKERS"), "", "goroutines coalescing store calls, negative = one call per request", integer(&s.StoreBatchWorkers)},
		{vars("CACHE_KEY_PREFIX"), "cache-key-prefix", "prefix of every counter key", str(&s.CacheKeyPrefix)},
		{vars("KEY_FORMAT"), "key-format", "counter key format: " + strings.Join(key.FormatNames, " or ") + "; envoy is byte-identical to envoyproxy/ratelimit", str(&r.keyFormat)},
		{vars("NEAR_LIMIT_RATIO"), "near-limit-ratio", "share of a limit above which an admitted decision also counts as near_limit", ratio(&s.NearLimitRatio)},
		{vars("SHADOW_MODE"), "shadow-mode", "answer OK even when over limit", boolean(&s.ShadowMode)},
		{vars("FAILURE_POLICY"), "failure-policy", "on store errors: " + strings.Join(decide.FailurePolicyNames, ", "), str(&r.policy)},
		{vars("STORE_TIMEOUT"), "store-timeout", "per-call store deadline", duration(&s.StoreTimeout)},
		{vars("EXPIRATION_JITTER_MAX_SECONDS"), "", "seconds a counter outlives its window", integer(&r.jitter)},
		{vars("OVER_LIMIT_CACHE_SIZE"), "over-limit-cache-size", "entries in the local over-limit cache, -1 disables", integer(&s.OverLimitCacheSize)},
		{vars("WINDOW_MODE"), "window-mode", "counter windows: " + strings.Join(window.ModeNames, " or ") + "; default calendar (USE_CALENDAR_MONTH_RATE_LIMIT is the reference's alias)", str(&r.windowMode)},
		{vars("RESET_TIME_ZONE"), "reset-time-zone", "IANA time zone of calendar day/week/month/year windows; default UTC", str(&s.ResetTimeZone)},
		{vars("RESERVATION_EXPIRY"), "reservation-expiry", "how long a reserving budget's hold outlives a request whose charge never comes, within [1s, 24h]", duration(&s.ReservationExpiry)},
	}
}

// storeSettings are the Valkey store and the embedded memory store.
func storeSettings(s *Settings, r *raw) []setting {
	return []setting{
		{vars("REDIS_SOCKET_TYPE"), "redis-socket-type", "Valkey connection type: tcp (unix sockets are not supported); unset: tcp when REDIS_URL is host:port", str(&s.RedisSocketType)},
		{vars("REDIS_URL"), "redis-url", "Valkey address host:port; empty uses the embedded memory store", str(&s.RedisURL)},
		{vars("REDIS_TYPE"), "redis-type", "single, cluster or sentinel", str(&s.RedisType)},
		{vars("REDIS_AUTH"), "", "Valkey password or user:password (never logged)", str(&s.RedisAuth)},
		{vars("REDIS_SENTINEL_AUTH"), "", "sentinel password or user:password (never logged)", str(&s.RedisSentinelAuth)},
		{vars("REDIS_AUTH_FILE"), "", "file holding REDIS_AUTH", str(&s.RedisAuthFile)},
		{vars("REDIS_SENTINEL_AUTH_FILE"), "", "file holding REDIS_SENTINEL_AUTH", str(&s.RedisSentinelAuthFile)},
		{vars("REDIS_TLS"), "redis-tls", "TLS to Valkey", boolean(&s.RedisTLS)},
		{vars("REDIS_TLS_CLIENT_CERT"), "", "client certificate file for Valkey", str(&s.RedisTLSClientCert)},
		{vars("REDIS_TLS_CLIENT_KEY"), "", "client key file for Valkey", str(&s.RedisTLSClientKey)},
		{vars("REDIS_TLS_CACERT"), "", "CA Valkey's certificate must chain to (system roots otherwise)", str(&s.RedisTLSCACert)},
		{vars("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"), "", "verify Valkey's chain but not its host name", boolean(&s.RedisTLSSkipHostnameVerification)},
		{vars("REDIS_TIMEOUT"), "", "Valkey dial timeout", duration(&s.RedisTimeout)},
		{vars("VALKEY_MAX_FLUSH_DELAY"), "valkey-max-flush-delay", "auto-pipeline flush delay", duration(&s.ValkeyMaxFlushDelay)},
		{vars("VALKEY_IDEMPOTENCY_WINDOW"), "", "how long a call's id is kept in Valkey, so how long an unanswered charge may be replayed exactly once, within [1s, 1h]; 0 = the store's default (1m)", duration(&s.ValkeyIdempotencyWindow)},
		{vars("VALKEY_PIPELINE_MULTIPLEX"), "", "2^n Valkey connections per node, 0 = the store's default", integer(&s.ValkeyPipelineMultiplex)},
		{vars("VALKEY_BUFFER_MAX_BYTES"), "", "bytes the outage buffer may hold while Valkey is away (the keys and ledger fields it keeps, plus about 184 bytes each; beyond it, or beyond 100,000 entries, charges are counted lost), within [" +
			strconv.Itoa(MinBufferMaxBytes) + " (1 MiB), " + strconv.Itoa(MaxBufferMaxBytes) + " (4 GiB)]; 0 = the store's default (" + strconv.Itoa(DefaultBufferMaxBytes) + ", 64 MiB)", integer(&s.ValkeyBufferMaxBytes)},
		{vars("MEMORY_MAX_COUNTERS"), "", "bound of the embedded store's live counters, 0 = its default (1,000,000)", integer(&s.MemoryMaxCounters)},
		{vars("MEMORY_MAX_BYTES"), "", "bound of the bytes of the embedded store's live counters (their keys plus about 128 bytes each), 0 = its default: " + strconv.Itoa(DefaultMemoryMaxBytes) + " (256 MiB), or half the Go soft memory limit set from the container's (MEMORY_LIMIT_RATIO) when that is lower", integer(&s.MemoryMaxBytes)},
		{vars("MEMORY_FULL_POLICY"), "", "at MEMORY_MAX_COUNTERS or MEMORY_MAX_BYTES: deny (enforce) or failure-policy (FAILURE_POLICY answers)", str(&r.fullPolicy)},
		{vars("MEMORY_SNAPSHOT_PATH"), "memory-snapshot-path", "file the embedded store's counters, holds and ledger are snapshotted to and restored from; default $XDG_STATE_HOME/budgetgen/ratelimit-memory-<grpc port>.snapshot (else under $HOME/.local/state), off = none", str(&s.MemorySnapshotPath)},
		{vars("MEMORY_SNAPSHOT_INTERVAL"), "", "time between embedded store snapshots, within [100ms, 1h]", duration(&s.MemorySnapshotInterval)},
	}
}

// observabilitySettings are metrics, logs, the shadow-week ledger and threshold events.
func observabilitySettings(s *Settings) []setting {
	return []setting{
		{vars("USE_PROMETHEUS"), "use-prometheus", "serve metrics on PROMETHEUS_ADDR too (the debug port always serves them)", boolean(&s.UsePrometheus)},
		{vars("PROMETHEUS_ADDR"), "prometheus-addr", "Prometheus listen address", str(&s.PrometheusAddr)},
		{vars("PROMETHEUS_PATH"), "", "Prometheus metrics path", str(&s.PrometheusPath)},
		{vars("LOG_LEVEL"), "log-level", "debug, info, warn or error (the reference's trace reads as debug, warning as warn, fatal and panic as error)", str(&s.LogLevel)},
		{vars("LOG_FORMAT"), "log-format", "text or json", str(&s.LogFormat)},
		{vars("BUDGET_USAGE_TOP_PRINCIPALS"), "budget-usage-top-principals", "principals per budget in ratelimit_budget_usage_ratio (the highest usage ratios, ranked, never named), within [0, 100]; 0 = off", integer(&s.BudgetUsageTopPrincipals)},
		{vars("THRESHOLD_EVENTS_URL"), "threshold-events-url", "POST each 80/90/100% threshold crossing as a CloudEvent to this http(s) URL; empty is off", str(&s.ThresholdEventsURL)},
		{vars("LEDGER_RETENTION_DAYS"), "ledger-retention-days", "days each day of shadow measurements is kept after it ends, within [8, 92]", integer(&s.LedgerRetentionDays)},
	}
}

// help is a setting's flag usage: its doc and the environment variables.
func (st setting) help() string {
	if len(st.env) == 0 {
		return st.doc
	}
	return st.doc + " (" + strings.Join(st.env, ", ") + ")"
}

// envName returns the first environment variable of the setting bound to
// field (a pointer to a field of s), so Validate's errors name settings
// from the table rather than by hand; "" when no setting binds it.
func (s *Settings) envName(field any) string {
	for _, st := range table(s, &raw{}) {
		if v, ok := st.v.(interface{ field() any }); ok && v.field() == field && len(st.env) > 0 {
			return st.env[0]
		}
	}
	return ""
}

// Values: flag.Value over a Settings field. Errors say what was expected;
// the caller names the setting and quotes the input.

type strValue struct{ p *string }

func str(p *string) flag.Value        { return strValue{p} }
func (v strValue) Set(s string) error { *v.p = s; return nil }
func (v strValue) String() string     { return deref(v.p) }
func (v strValue) field() any         { return v.p }
func deref[T any](p *T) (z T) {
	if p != nil {
		z = *p
	}
	return z
}

type intValue struct{ p *int }

func integer(p *int) flag.Value { return intValue{p} }
func (v intValue) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return errors.New("not an integer")
	}
	*v.p = n
	return nil
}
func (v intValue) String() string { return strconv.Itoa(deref(v.p)) }
func (v intValue) field() any     { return v.p }

type boolValue struct{ p *bool }

func boolean(p *bool) flag.Value { return boolValue{p} }
func (v boolValue) Set(s string) error {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return errors.New("not a boolean")
	}
	*v.p = b
	return nil
}
func (v boolValue) String() string   { return strconv.FormatBool(deref(v.p)) }
func (v boolValue) IsBoolFlag() bool { return true }
func (v boolValue) field() any       { return v.p }

type durationValue struct{ p *time.Duration }

func duration(p *time.Duration) flag.Value { return durationValue{p} }
func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return errors.New("not a duration")
	}
	*v.p = d
	return nil
}
func (v durationValue) String() string { return deref(v.p).String() }
func (v durationValue) field() any     { return v.p }

type ratioValue struct{ p *float32 }

func ratio(p *float32) flag.Value { return ratioValue{p} }
func (v ratioValue) Set(s string) error {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 32)
	if err != nil || math.IsNaN(f) {
		// ParseFloat accepts "NaN", which every range check lets through.
		return errors.New("not a number")
	}
	*v.p = float32(f)
	return nil
}
func (v ratioValue) String() string { return strconv.FormatFloat(float64(deref(v.p)), 'g', -1, 32) }
func (v ratioValue) field() any     { return v.p }
