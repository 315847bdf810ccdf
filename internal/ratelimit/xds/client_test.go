package xds_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachetypes "github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/xds"
	"github.com/budgetgen/budgetgen/internal/schedtest"
	"github.com/budgetgen/budgetgen/internal/tlsconfig"
	"github.com/budgetgen/budgetgen/internal/tlsconfig/tlstest"
)

// egServer is an xDS server built the way Envoy Gateway's rate limit runner
// builds its own: a non-ADS snapshot cache keyed by node id, go-control-plane's
// server, mTLS with client certificates required.
type egServer struct {
	t     *testing.T
	addr  string
	tls   *tls.Config
	cache cachev3.SnapshotCache
	grpc  *grpc.Server
	done  chan struct{}

	mu   sync.Mutex
	reqs []*discoveryv3.DiscoveryRequest
}

func startEG(t *testing.T, addr string, tlsCfg *tls.Config) *egServer {
	t.Helper()
	s := &egServer{t: t, tls: tlsCfg, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), done: make(chan struct{})}
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // a restarted server takes the same port back
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	var opts []grpc.ServerOption
	if tlsCfg != nil { // nil: plaintext
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	s.grpc = grpc.NewServer(opts...)
	ctx, cancel := context.WithCancel(context.Background())
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
		s.mu.Lock()
		s.reqs = append(s.reqs, r)
		s.mu.Unlock()
		return nil
	}}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.grpc, serverv3.NewServer(ctx, s.cache, cb))
	go func() { _ = s.grpc.Serve(ln); close(s.done) }()
	t.Cleanup(func() { cancel(); s.stop() })
	return s
}

func (s *egServer) stop() {
	s.grpc.Stop()
	<-s.done
}

func (s *egServer) set(version string, cfgs ...*rlsconfv3.RateLimitConfig) {
	s.t.Helper()
	res := make([]cachetypes.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]cachetypes.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), "envoy-ratelimit", snap); err != nil {
		s.t.Fatal(err)
	}
}

func (s *egServer) requests() []*discoveryv3.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discoveryv3.DiscoveryRequest(nil), s.reqs...)
}

// applied records what the service installed, validating like the service
// does (config.FromProto) and keeping the last good config on error.
type applied struct {
	mu       sync.Mutex
	domains  []string
	limit    uint32
	calls    int // configs installed
	attempts int // apply calls, good or bad
}

func (a *applied) apply(_ context.Context, cfgs []*rlsconfv3.RateLimitConfig) error {
	a.mu.Lock()
	a.attempts++
	a.mu.Unlock()
	c, err := config.FromProto(cfgs)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	a.domains = c.Domains()
	a.limit = 0
	for _, l := range c.Limits() {
		a.limit = l.RequestsPerUnit
	}
	return nil
}

func (a *applied) get() (string, uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strings.Join(a.domains, ","), a.limit
}

func cfg(domain string, limit uint32) *rlsconfv3.RateLimitConfig {
	key := domain + "/rule/0"
	return &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: key, Value: key,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "rule-0-match-0", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: limit}}},
	}}}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

type certs struct {
	server       *tls.Config
	clientOpts   tlsconfig.ClientOptions
	noCertClient tlsconfig.ClientOptions
}

func newCerts(t *testing.T) certs {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "eg")
	srv := ca.Server("envoy-gateway")
	cli := ca.Client("envoy-ratelimit")
	s, err := tlsconfig.Server(tlsconfig.ServerOptions{CertFile: srv.CertFile, KeyFile: srv.KeyFile, CAFile: ca.CertFile})
	if err != nil {
		t.Fatal(err)
	}
	return certs{
		server:       s,
		clientOpts:   tlsconfig.ClientOptions{CertFile: cli.CertFile, KeyFile: cli.KeyFile, CAFile: ca.CertFile},
		noCertClient: tlsconfig.ClientOptions{CAFile: ca.CertFile},
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestAgainstGoControlPlaneServer(t *testing.T) {
	cs := newCerts(t)
	eg := startEG(t, "127.0.0.1:0", cs.server)
	eg.set("1", cfg("llm/budgets", 100))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var got applied
	c, err := xds.New(xds.Options{
		ServerURL:      eg.addr,
		TLS:            func() (*tls.Config, error) { return tlsconfig.Client(cs.clientOpts) },
		Apply:          got.apply,
		BackoffInitial: 20 * time.Millisecond,
		BackoffMax:     200 * time.Millisecond,
		Logger:         quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(ctx) }()

	// Initial config.
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := c.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	if d, l := got.get(); d != "llm/budgets" || l != 100 || c.Version() != "1" {
		t.Fatalf("initial = %s %d v%s", d, l, c.Version())
	}
	acked := func(version string) func() bool {
		return func() bool {
			for _, r := range eg.requests() {
				if r.VersionInfo == version && r.ResponseNonce != "" && r.ErrorDetail == nil {
					return true
				}
			}
			return false
		}
	}
	eventually(t, "ACK of version 1", acked("1"))
	first := eg.requests()[0]
	if first.GetNode().GetId() != "envoy-ratelimit" || first.TypeUrl != xds.TypeURL || first.VersionInfo != "" {
		t.Errorf("first request = node %q type %q version %q", first.GetNode().GetId(), first.TypeUrl, first.VersionInfo)
	}

	// An update.
	eg.set("2", cfg("llm/budgets", 200), cfg("team/other", 5))
	eventually(t, "version 2 applied", func() bool { return c.Version() == "2" })
	if d, _ := got.get(); d != "llm/budgets,team/other" {
		t.Errorf("after update domains = %s", d)
	}
	eventually(t, "ACK of version 2", acked("2"))

	// A bad config: NACKed with the reason, the last good stays.
	eg.set("3", cfg("llm/budgets", 300), &rlsconfv3.RateLimitConfig{Name: "broken"})
	var nack *discoveryv3.DiscoveryRequest
	eventually(t, "NACK of version 3", func() bool {
		for _, r := range eg.requests() {
			if r.ErrorDetail != nil {
				nack = r
				return true
			}
		}
		return false
	})
	if !strings.Contains(nack.ErrorDetail.Message, "empty domain") || nack.VersionInfo != "2" {
		t.Errorf("NACK = version %q detail %q; want version 2 and the reason", nack.VersionInfo, nack.ErrorDetail.Message)
	}
	if d, _ := got.get(); d != "llm/budgets,team/other" || c.Version() != "2" {
		t.Errorf("after a bad config: domains %s version %s; want the last good (2)", d, c.Version())
	}
	// go-control-plane resends the bad version after each NACK; the client
	// applies it again only after a pause (20, 40, 80, 160, 200 ms ...), so
	// its NACKs are paced instead of spinning.
	// Wait for the first resent NACK, then measure the pace over the next
	// two: each gap after the second NACK is at least 40 ms (a timer never
	// fires early), so n NACKs counted within a window of w took
	// (n-1)*40ms <= w. A loaded scheduler only widens w; a client that
	// spins counts hundreds of NACKs in the same window.
	eventually(t, "a resent NACK", func() bool { return c.Stats().Nacks >= 2 })
	from, startNacks := time.Now(), c.Stats().Nacks
	eventually(t, "two more paced NACKs", func() bool { return c.Stats().Nacks >= startNacks+2 })
	st := c.Stats()
	window, counted := time.Since(from), st.Nacks-startNacks
	if time.Duration(counted-1)*40*time.Millisecond > window || !strings.Contains(st.LastNack, "empty domain") {
		t.Errorf("stats = %+v: %d NACKs within %v; want NACKs at least 40 ms apart, naming the reason", st, counted, window)
	}
	got.mu.Lock()
	if got.attempts < 3 || got.calls != 2 {
		t.Errorf("apply attempts %d, installs %d; want at least 3 and 2 (a resent bad version is tried again, paced, and still not installed)", got.attempts, got.calls)
	}
	got.mu.Unlock()

	// A fixed config after the bad one is applied.
	eg.set("4", cfg("llm/budgets", 400))
	eventually(t, "version 4 applied", func() bool { return c.Version() == "4" })

	// Server restart: a new process numbering snapshots from 1 again with a
	// different config. The client reconnects and applies it.
	addr := eg.addr
	eg.stop()
	eg2 := startEG(t, addr, cs.server)
	eg2.set("1", cfg("restarted/policy", 7))
	eventually(t, "config from the restarted server", func() bool {
		d, l := got.get()
		return d == "restarted/policy" && l == 7
	})
	if c.Version() != "1" || c.Stats().Connects < 2 {
		t.Errorf("after restart version %q stats %+v", c.Version(), c.Stats())
	}

	cancel()
	select {
	case err := <-runDone:
		if err != context.Canceled {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop on cancel")
	}
}

func TestClientWithoutCertificateIsRefused(t *testing.T) {
	cs := newCerts(t)
	eg := startEG(t, "127.0.0.1:0", cs.server)
	eg.set("1", cfg("llm/budgets", 100))
	var got applied
	c, err := xds.New(xds.Options{
		ServerURL:      eg.addr,
		TLS:            func() (*tls.Config, error) { return tlsconfig.Client(cs.noCertClient) },
		Apply:          got.apply,
		BackoffInitial: 20 * time.Millisecond,
		BackoffMax:     50 * time.Millisecond,
		Logger:         quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() { _ = c.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer wcancel()
	if err := c.WaitReady(wctx); err == nil {
		t.Fatal("a client without a certificate got a config")
	}
	if st := c.Stats(); st.StreamErrors < 2 || st.Acks != 0 {
		t.Errorf("stats = %+v; want repeated failures with backoff and no config", st)
	}
	got.mu.Lock()
	if got.attempts != 0 {
		t.Error("config applied")
	}
	got.mu.Unlock()
}

func TestBackoffIsBoundedAndStopsOnCancel(t *testing.T) {
	// Nothing listens here: every attempt fails.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c, err := xds.New(xds.Options{
		ServerURL:      addr,
		Apply:          func(context.Context, []*rlsconfv3.RateLimitConfig) error { return nil },
		BackoffInitial: 10 * time.Millisecond,
		BackoffMax:     40 * time.Millisecond,
		Rand:           func() float64 { return 0.999 },
		Logger:         quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	lag := schedtest.Start()
	start := time.Now()
	if err := c.Run(ctx); err != context.DeadlineExceeded {
		t.Errorf("Run = %v", err)
	}
	// 2 s plus the scheduler's worst lag in this run: Run must return
	// soon after its context ends, not after a backoff or a dial.
	el := time.Since(start)
	if _, lagMax := lag.Stop(); el > 2*time.Second+lagMax {
		t.Errorf("Run took %v after its context ended (bound 2 s + scheduler lag %v)", el, lagMax)
	}
	// 10+20+40+40+... ms within 600 ms: more than 8 attempts means the wait is
	// capped at BackoffMax rather than growing without bound.
	if n := c.Stats().StreamErrors; n < 8 {
		t.Errorf("attempts = %d, want the backoff capped at 40ms", n)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := xds.New(xds.Options{Apply: func(context.Context, []*rlsconfv3.RateLimitConfig) error { return nil }}); err == nil || !strings.Contains(err.Error(), "CONFIG_GRPC_XDS_SERVER_URL") {
		t.Errorf("err = %v", err)
	}
	if _, err := xds.New(xds.Options{ServerURL: "x:1"}); err == nil {
		t.Error("no apply callback accepted")
	}
}

// A rejection can depend on more than the resources: the service merges the
// xDS config with the files of CONFIG_DIR, and a domain in both is refused
// until one side drops it. go-control-plane resends the NACKed version (its
// snapshot is unchanged), so the client must apply the resend again, after
// its pause, rather than NACK it with the remembered reason: otherwise the
// config stays rejected until Envoy Gateway happens to publish a new version.
func TestResentVersionIsAppliedAgainAfterThePause(t *testing.T) {
	eg := startEG(t, "127.0.0.1:0", nil)
	var (
		mu       sync.Mutex
		conflict = true
	)
	var got applied
	apply := func(ctx context.Context, cfgs []*rlsconfv3.RateLimitConfig) error {
		mu.Lock()
		c := conflict
		mu.Unlock()
		if c {
			return errors.New("domain llm/budgets is also in a config file")
		}
		return got.apply(ctx, cfgs)
	}
	c, err := xds.New(xds.Options{ServerURL: eg.addr, Apply: apply, BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() { _ = c.Run(ctx) }()
	eg.set("1", cfg("llm/budgets", 100))
	eventually(t, "NACKs of version 1", func() bool { return c.Stats().Nacks >= 2 })
	mu.Lock()
	conflict = false // the file dropped the domain; the snapshot is unchanged
	mu.Unlock()
	eventually(t, "version 1 applied once the conflict is gone", func() bool { return c.Version() == "1" })
	if d, l := got.get(); d != "llm/budgets" || l != 100 {
		t.Errorf("applied %s %d; want llm/budgets 100", d, l)
	}
}
