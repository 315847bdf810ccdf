package xds_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
	"github.com/budgetgen/budgetgen/internal/ratelimit/service"
	"github.com/budgetgen/budgetgen/internal/ratelimit/xds"
	"github.com/budgetgen/budgetgen/internal/tlsconfig"
	"github.com/budgetgen/budgetgen/internal/tlsconfig/tlstest"
)

// TestServiceWithEnvoyGatewaySettings runs the service with the environment
// Envoy Gateway sets on its rate limit Deployment: config over xDS with mTLS
// from a go-control-plane server, gRPC served over mTLS. Envoy (a client
// certificate from the same CA) gets decisions from the xDS config and sees an
// update; a client without a certificate is refused.
func TestServiceWithEnvoyGatewaySettings(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "eg")
	egCert := ca.Server("envoy-gateway")
	rlCert := ca.Peer("envoy-ratelimit")
	envoyCert := ca.Client("envoy")
	egTLS, err := tlsconfig.Server(tlsconfig.ServerOptions{CertFile: egCert.CertFile, KeyFile: egCert.KeyFile, CAFile: ca.CertFile})
	if err != nil {
		t.Fatal(err)
	}
	eg := startEG(t, "127.0.0.1:0", egTLS)
	eg.set("1", cfg("llm/budgets", 2))

	env := map[string]string{
		"XDG_STATE_HOME":                     t.TempDir(), // the embedded store's snapshot, this test's own
		"CONFIG_TYPE":                        "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL":         eg.addr,
		"CONFIG_GRPC_XDS_NODE_ID":            "envoy-ratelimit",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS":     "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":    rlCert.CertFile,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":     rlCert.KeyFile,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":  ca.CertFile,
		"CONFIG_GRPC_XDS_SERVER_TLS_SAN":     "localhost",
		"GRPC_SERVER_USE_TLS":                "true",
		"GRPC_SERVER_TLS_CERT":               rlCert.CertFile,
		"GRPC_SERVER_TLS_KEY":                rlCert.KeyFile,
		"GRPC_SERVER_TLS_CA_CERT":            ca.CertFile,
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "false",
		"USE_STATSD":                         "false",
		"GRPC_HOST":                          "127.0.0.1", "GRPC_PORT": "0",
		"HOST": "127.0.0.1", "PORT": "0",
		"DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0",
		"LOG_LEVEL": "warn",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ready := make(chan *server.Server, 1)
	done := make(chan error, 1)
	go func() {
		done <- service.Run(ctx, nil, func(k string) string { return env[k] }, io.Discard, func(s *server.Server) { ready <- s })
	}()
	var srv *server.Server
	select {
	case srv = <-ready:
	case err := <-done:
		t.Fatalf("service exited: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("service did not start")
	}
	grpcAddr, _, _, _ := srv.Addrs()

	dial := func(o tlsconfig.ClientOptions) rlsv3.RateLimitServiceClient {
		tc, err := tlsconfig.Client(o)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(grpcAddr.String(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return rlsv3.NewRateLimitServiceClient(conn)
	}
	envoy := dial(tlsconfig.ClientOptions{CertFile: envoyCert.CertFile, KeyFile: envoyCert.KeyFile, CAFile: ca.CertFile, ServerName: "localhost"})
	ask := func(c rlsv3.RateLimitServiceClient, user string) (rlsv3.RateLimitResponse_Code, error) {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		resp, err := c.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "llm/budgets", Descriptors: []*rlcommonv3.RateLimitDescriptor{{
			Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "llm/budgets/rule/0", Value: "llm/budgets/rule/0"}, {Key: "rule-0-match-0", Value: user}},
		}}})
		return resp.GetOverallCode(), err
	}
	var codes []string
	for range 3 {
		code, err := ask(envoy, "alice")
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, code.String())
	}
	if got := strings.Join(codes, ","); got != "OK,OK,OVER_LIMIT" {
		t.Errorf("alice with limit 2: %s", got)
	}

	// An update over xDS changes the limit.
	eg.set("2", cfg("llm/budgets", 5))
	probe := 0
	eventually(t, "limit 5 from version 2", func() bool {
		// A fresh principal's third hit is OVER_LIMIT under limit 2, OK under 5.
		probe++
		var code rlsv3.RateLimitResponse_Code
		for range 3 {
			c, err := ask(envoy, "probe-"+strconv.Itoa(probe))
			if err != nil {
				return false
			}
			code = c
		}
		return code == rlsv3.RateLimitResponse_OK
	})
	codes = codes[:0]
	for range 6 {
		code, err := ask(envoy, "bob")
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, code.String())
	}
	if got := strings.Join(codes, ","); got != "OK,OK,OK,OK,OK,OVER_LIMIT" {
		t.Errorf("bob with limit 5: %s", got)
	}

	// mTLS: no client certificate, no answer.
	anon := dial(tlsconfig.ClientOptions{CAFile: ca.CertFile, ServerName: "localhost"})
	if _, err := ask(anon, "mallory"); err == nil {
		t.Error("a client without a certificate was answered")
	}

	cancel()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("service did not stop")
	}
}

// With FORCE_START_WITHOUT_INITIAL_CONFIG=true (what EG sets) the service
// serves before any config arrives (answering Unavailable), then applies
// the first one; with false it would wait for it.
func TestServiceForceStartWithoutInitialConfig(t *testing.T) {
	plain := startEG(t, "127.0.0.1:0", nil)
	env := map[string]string{
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": plain.addr, "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "USE_STATSD": "false", "LOG_LEVEL": "warn",
		"GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0", "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0",
		"XDG_STATE_HOME": t.TempDir(),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ready := make(chan *server.Server, 1)
	done := make(chan error, 1)
	go func() {
		done <- service.Run(ctx, nil, func(k string) string { return env[k] }, io.Discard, func(s *server.Server) { ready <- s })
	}()
	var srv *server.Server
	select {
	case srv = <-ready:
	case err := <-done:
		t.Fatalf("service exited: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("service did not start without an initial config")
	}
	grpcAddr, _, _, _ := srv.Addrs()
	conn, err := grpc.NewClient(grpcAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	ask := func() (rlsv3.RateLimitResponse_Code, error) {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		resp, err := c.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "llm/budgets", Descriptors: []*rlcommonv3.RateLimitDescriptor{{
			Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "llm/budgets/rule/0", Value: "llm/budgets/rule/0"}, {Key: "rule-0-match-0", Value: "carol"}},
		}}})
		return resp.GetOverallCode(), err
	}
	// Serving, but no config yet: an error status (Envoy applies its failure
	// mode, open by default), not a decision.
	if code, err := ask(); status.Code(err) != grpccodes.Unavailable {
		t.Errorf("before any config: %s %v, want Unavailable", code, err)
	}
	plain.set("1", cfg("llm/budgets", 0)) // kill switch
	eventually(t, "the first config applied", func() bool {
		code, err := ask()
		return err == nil && code == rlsv3.RateLimitResponse_OVER_LIMIT
	})
	cancel()
	<-done
}

// runService starts service.Run with env (plus loopback listeners and the
// embedded store) and returns its server; the test's cleanup stops it.
func runService(t *testing.T, env map[string]string) *server.Server {
	t.Helper()
	all := map[string]string{
		"USE_STATSD": "false", "LOG_LEVEL": "warn", "XDG_STATE_HOME": t.TempDir(),
		"GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0", "HOST": "127.0.0.1", "PORT": "0", "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0",
	}
	for k, v := range env {
		all[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan *server.Server, 1)
	done := make(chan error, 1)
	go func() {
		done <- service.Run(ctx, nil, func(k string) string { return all[k] }, io.Discard, func(s *server.Server) { ready <- s })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("service did not stop")
		}
	})
	select {
	case srv := <-ready:
		return srv
	case err := <-done:
		t.Fatalf("service exited: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("service did not start")
	}
	return nil
}

// metrics returns the service's Prometheus exposition.
func metrics(t *testing.T, srv *server.Server) string {
	t.Helper()
	_, _, debug, _ := srv.Addrs()
	resp, err := http.Get("http://" + debug.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A response the client NACKs before the config is built (a resource that
// does not decode, or of another type) keeps the last good config like a
// config the service rejects, and must be counted like one: the config
// load metrics are how an operator sees that Envoy Gateway's config is not
// in force.
func TestServiceCountsUndecodableConfigAsRejected(t *testing.T) {
	good, err := anypb.New(cfg("llm/budgets", 1))
	if err != nil {
		t.Fatal(err)
	}
	ads := &scriptedADS{requests: make(chan *discoveryv3.DiscoveryRequest, 16), responses: []*discoveryv3.DiscoveryResponse{
		{VersionInfo: "1", Nonce: "n1", TypeUrl: xds.TypeURL, Resources: []*anypb.Any{good}},
		{VersionInfo: "2", Nonce: "n2", TypeUrl: xds.TypeURL, Resources: []*anypb.Any{{TypeUrl: xds.TypeURL, Value: []byte{0xff, 0xff, 0xff}}}},
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, ads)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)

	srv := runService(t, map[string]string{
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": ln.Addr().String(), "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
	})
	for _, want := range []string{"n1", "n1", "n2"} { // subscribe, ACK, NACK
		select {
		case r := <-ads.requests:
			if r.ResponseNonce != want && r.ResponseNonce != "" {
				t.Fatalf("request nonce %q, want %q", r.ResponseNonce, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no NACK of version 2")
		}
	}
	eventually(t, "the rejection counted", func() bool {
		m := metrics(t, srv)
		return strings.Contains(m, `ratelimit_config_loads_total{result="error",source="xds"} 1`) &&
			strings.Contains(m, `ratelimit_config_last_load_success{source="xds"} 0`)
	})
}

// XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES is the reference's way to take a config
// larger than the client's default limit (src/settings/settings.go, used in
// src/provider/xds_grpc_sotw_provider.go getGrpcConnection); a deployment
// that needs it must get the limit it sets. Set here below a config's size
// (a config over 16 MiB costs half a minute under the race detector): that
// config is reported as rejected, a smaller one is applied.
func TestServiceHonoursXDSMaxMessageSize(t *testing.T) {
	big := egListenerConfig("envoy-gateway-system/eg/http", 600)
	if n := proto.Size(big); n < 64<<10 {
		t.Fatalf("config of %d bytes, want one over 64 KiB", n)
	}
	eg := startEG(t, "127.0.0.1:0", nil)
	eg.set("1", cfg("llm/budgets", 1))
	srv := runService(t, map[string]string{
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": eg.addr, "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
		"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": strconv.Itoa(64 << 10),
	})
	eg.set("2", big)
	eventually(t, "the config over the limit reported", func() bool {
		m := metrics(t, srv)
		return strings.Contains(m, `ratelimit_config_last_load_success{source="xds"} 0`) && strings.Contains(m, "ratelimit_config_rules 1\n")
	})
	eg.set("3", cfg("llm/budgets", 3), cfg("team/other", 3))
	eventually(t, "the next config, under the limit", func() bool {
		m := metrics(t, srv)
		return strings.Contains(m, `ratelimit_config_last_load_success{source="xds"} 1`) && strings.Contains(m, "ratelimit_config_rules 2\n")
	})
}
