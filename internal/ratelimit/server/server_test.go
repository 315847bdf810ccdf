package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/config"
	"github.com/budgetgen/budgetgen/internal/ratelimit/engine"
	"github.com/budgetgen/budgetgen/internal/ratelimit/metrics"
	"github.com/budgetgen/budgetgen/internal/ratelimit/observe"
	"github.com/budgetgen/budgetgen/internal/schedtest"
	"github.com/budgetgen/budgetgen/internal/store/memory"
	"github.com/budgetgen/budgetgen/internal/syncbuf"
)

const cfgYAML = `domain: d
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1}
`

type running struct {
	srv    *Server
	eng    *engine.Engine
	conn   *grpc.ClientConn
	client rlpb.RateLimitServiceClient
	http   string
	debug  string
	stop   func()
}

func start(t *testing.T, o Options, clientCreds credentials.TransportCredentials) *running {
	t.Helper()
	mem := memory.New(memory.Options{})
	reg := prometheus.NewRegistry()
	eng, err := engine.New(engine.Options{Store: mem, Observers: []observe.Observer{observe.NewMetrics(metrics.New(reg))}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Load([]config.File{{Name: "c.yaml", Data: []byte(cfgYAML)}})
	if err != nil {
		t.Fatal(err)
	}
	eng.SetConfig(c)
	o.GRPCAddr, o.HTTPAddr, o.DebugAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.Gatherer = reg
	srv, err := New(eng, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, time.Second) }()
	g, h, d, _ := srv.Addrs()
	if clientCreds == nil {
		clientCreds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(clientCreds))
	if err != nil {
		t.Fatal(err)
	}
	var stop func()
	r := &running{srv: srv, eng: eng, conn: conn, client: rlpb.NewRateLimitServiceClient(conn), http: "http://" + h.String(), debug: "http://" + d.String()}
	var once sync.Once
	r.stop = func() { once.Do(stop) }
	stop = func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		eng.Close()
		mem.Close()
	}
	t.Cleanup(r.stop)
	return r
}

func rlReq(user string) *rlpb.RateLimitRequest {
	return &rlpb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: user}},
	}}}
}

func TestGRPCShouldRateLimitAndHealth(t *testing.T) {
	forEachTransport(t, testGRPCShouldRateLimitAndHealth)
}

func testGRPCShouldRateLimitAndHealth(t *testing.T, transport string) {
	r := start(t, Options{Transport: transport}, nil)
	ctx := context.Background()
	resp, err := r.client.ShouldRateLimit(ctx, rlReq("a"))
	if err != nil || resp.OverallCode != rlpb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 ||
		resp.Statuses[0].DurationUntilReset.GetSeconds() <= 0 || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("first call: %v %v", resp, err)
	}
	resp, err = r.client.ShouldRateLimit(ctx, rlReq("a"))
	if err != nil || resp.OverallCode != rlpb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second call: %v %v", resp, err)
	}
	_, err = r.client.ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "d"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no descriptors: %v", err)
	}
	hc := healthpb.NewHealthClient(r.conn)
	for _, name := range []string{"", HealthServiceName} {
		h, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", name, h, err)
		}
	}
	r.srv.Health().Fail(ComponentStore)
	if h, _ := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: HealthServiceName}); h.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health after failure: %v", h)
	}
}

// invalidUTF8Request encodes a request whose domain is not UTF-8; the proto
// library refuses to marshal that, so it is built by hand.
func invalidUTF8Request() []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "d\xff")
	return b
}

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.(*[]byte); ok {
		return *b, nil
	}
	return proto.Marshal(v.(proto.Message))
}
func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }

func TestMalformedWireRequestIsInvalidArgument(t *testing.T) {
	forEachTransport(t, testMalformedWireRequestIsInvalidArgument)
}

func testMalformedWireRequestIsInvalidArgument(t *testing.T, transport string) {
	r := start(t, Options{Transport: transport}, nil)
	for name, body := range map[string][]byte{
		"invalid utf8": invalidUTF8Request(),
		"garbage":      {0xff, 0xff, 0xff},
	} {
		t.Run(name, func(t *testing.T) {
			var out rlpb.RateLimitResponse
			err := r.conn.Invoke(context.Background(), rlpb.RateLimitService_ShouldRateLimit_FullMethodName, &body, &out, grpc.ForceCodec(rawCodec{}))
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
		})
	}
}

func TestHTTPEndpoints(t *testing.T) {
	r := start(t, Options{}, nil)
	post := func(body string) (int, string) {
		resp, err := http.Post(r.http+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	body := `{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}`
	if code, b := post(body); code != 200 || !strings.Contains(b, `"overallCode":"OK"`) {
		t.Fatalf("first: %d %s", code, b)
	}
	if code, b := post(body); code != 429 || !strings.Contains(b, `"overallCode":"OVER_LIMIT"`) {
		t.Fatalf("second: %d %s", code, b)
	}
	if code, _ := post(`{"domain":`); code != 400 {
		t.Fatalf("bad json: %d", code)
	}
	if code, _ := post(`{"domain":""}`); code != 400 {
		t.Fatalf("invalid request: %d", code)
	}
	get := func(u string) (int, string) {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := get(r.http + "/healthcheck"); code != 200 || b != "OK" {
		t.Fatalf("healthcheck: %d %q", code, b)
	}
	if code, b := get(r.debug + "/rlconfig"); code != 200 || !strings.Contains(b, "d.user: unit=DAY requests_per_unit=1") {
		t.Fatalf("rlconfig: %d %q", code, b)
	}
	if code, b := get(r.debug + "/metrics"); code != 200 || !strings.Contains(b, `ratelimit_decisions_total{budget="",domain="d",gateway="",mode="enforce",outcome="over_limit",rule="user",window="day"} 1`) {
		t.Fatalf("metrics: %d %s", code, b)
	}
	if code, _ := get(r.debug + "/debug/pprof/"); code != 200 {
		t.Fatalf("pprof: %d", code)
	}
	r.srv.Health().Fail(ComponentShutdown)
	if code, _ := get(r.http + "/healthcheck"); code != 500 {
		t.Fatalf("unhealthy healthcheck: %d", code)
	}
}

func TestRequireConfigForHealth(t *testing.T) {
	r := start(t, Options{RequireConfigForHealth: true}, nil)
	if r.srv.Health().Healthy() {
		t.Fatal("healthy before any config load was reported")
	}
	if code, body := httpGet(t, r.http+"/healthcheck"); code != 500 || !strings.Contains(body, "config: no rate limit config loaded yet") {
		t.Fatalf("healthcheck before a config: %d %q", code, body)
	}
	r.srv.Health().OK(ComponentConfig)
	if !r.srv.Health().Healthy() {
		t.Fatal("not healthy after config load")
	}
}

func TestTLSOption(t *testing.T) { forEachTransport(t, testTLSOption) }

func testTLSOption(t *testing.T, transport string) {
	cert, pool := selfSigned(t)
	r := start(t, Options{Transport: transport, TLS: &tls.Config{Certificates: []tls.Certificate{cert}}}, credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost"}))
	if _, err := r.client.ShouldRateLimit(context.Background(), rlReq("tls")); err != nil {
		t.Fatalf("over TLS: %v", err)
	}
	g, _, _, _ := r.srv.Addrs()
	plain, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := rlpb.NewRateLimitServiceClient(plain).ShouldRateLimit(ctx, rlReq("x")); err == nil {
		t.Fatal("plaintext call succeeded against a TLS server")
	}
}

func TestCodecMarshalsLikeProto(t *testing.T) {
	r := start(t, Options{}, nil)
	resp, err := r.eng.ShouldRateLimit(context.Background(), rlReq("codec"))
	if err != nil {
		t.Fatal(err)
	}
	vt, err := marshalResponse(nil, resp)
	if err != nil {
		t.Fatal(err)
	}
	var back rlpb.RateLimitResponse
	if err := proto.Unmarshal(vt, &back); err != nil || !proto.Equal(&back, resp) {
		t.Fatalf("vtproto bytes do not round-trip: %v", err)
	}
}

func FuzzHandler(f *testing.F) {
	good, _ := proto.Marshal(rlReq("a"))
	f.Add(good)
	f.Add(invalidUTF8Request())
	f.Add([]byte{})
	mem := memory.New(memory.Options{})
	defer mem.Close()
	eng, _ := engine.New(engine.Options{Store: mem})
	defer eng.Close()
	c, _ := config.Load([]config.File{{Name: "c.yaml", Data: []byte(cfgYAML)}})
	eng.SetConfig(c)
	s := &Server{d: eng}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := s.serveShouldRateLimit(context.Background(), bytes.Clone(data), nil)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument {
				t.Fatalf("code %s: %v", c, err)
			}
			return
		}
		var back rlpb.RateLimitResponse
		if err := proto.Unmarshal(b, &back); err != nil {
			t.Fatalf("response does not decode: %v", err)
		}
		if back.OverallCode == rlpb.RateLimitResponse_UNKNOWN {
			t.Fatalf("answer without an overall code: %v", &back)
		}
	})
}

// TestHealthWatch: Watch sends the status at once and every change; an
// unknown service gets SERVICE_UNKNOWN; at shutdown the watcher gets
// NOT_SERVING, then its stream ends, and the stop does not wait for it.
func TestHealthWatch(t *testing.T) { forEachTransport(t, testHealthWatch) }

func testHealthWatch(t *testing.T, transport string) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	eng, err := engine.New(engine.Options{Store: mem})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	srv, err := New(eng, Options{Transport: transport, GRPCAddr: "127.0.0.1:0", Gatherer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, 10*time.Second) }()
	g, _, _, _ := srv.Addrs()
	conn, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{Service: HealthServiceName})
	if err != nil {
		t.Fatal(err)
	}
	next := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		m, err := w.Recv()
		if err != nil || m.Status != want {
			t.Fatalf("watch: %v %v, want %v", m, err, want)
		}
	}
	next(healthpb.HealthCheckResponse_SERVING)
	srv.Health().Fail(ComponentStore)
	next(healthpb.HealthCheckResponse_NOT_SERVING)
	srv.Health().OK(ComponentStore)
	next(healthpb.HealthCheckResponse_SERVING)

	u, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{Service: "nope"})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := u.Recv(); err != nil || m.Status != healthpb.HealthCheckResponse_SERVICE_UNKNOWN {
		t.Fatalf("unknown service: %v %v", m, err)
	}

	lag := schedtest.Start()
	start := time.Now()
	cancel() // shutdown
	next(healthpb.HealthCheckResponse_NOT_SERVING)
	if _, err := w.Recv(); err != io.EOF {
		t.Fatalf("after NOT_SERVING at shutdown: %v, want the stream to end", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	// 3 s plus the scheduler's worst lag in this run: a shutdown that
	// waited for the watcher would take the 10 s drain.
	if el, lagMax := time.Since(start), worstLag(lag); el > 3*time.Second+lagMax {
		t.Fatalf("shutdown took %v with watchers open (drain 10 s; bound 3 s + scheduler lag %v)", el, lagMax)
	}
}

// forEachTransport runs a test against both gRPC transports.
func forEachTransport(t *testing.T, f func(t *testing.T, transport string)) {
	for _, tr := range Transports {
		t.Run(tr, func(t *testing.T) { f(t, tr) })
	}
}

// forEachTransportParallel is forEachTransport for the tests that mostly
// wait on another program (h2spec's per-case timeouts, node): the test runs
// in parallel (after the package's sequential tests, beside the other
// parallel ones), and so do its transports. Each has its own server on its
// own ports; they share nothing.
func forEachTransportParallel(t *testing.T, f func(t *testing.T, transport string)) {
	t.Parallel()
	for _, tr := range Transports {
		t.Run(tr, func(t *testing.T) { t.Parallel(); f(t, tr) })
	}
}

func TestUnknownTransportRefused(t *testing.T) {
	if _, err := New(nil, Options{GRPCAddr: "127.0.0.1:0", Transport: "netty"}); err == nil || !strings.Contains(err.Error(), `unknown gRPC transport "netty"`) {
		t.Fatalf("err = %v", err)
	}
}

// Both transports: gzip requests are accepted and answered, connections
// over MaxConnections are closed at accept, and the counts are metrics.
func TestTransportLimitsAndGzip(t *testing.T) { forEachTransport(t, testTransportLimitsAndGzip) }

func testTransportLimitsAndGzip(t *testing.T, transport string) {
	reg := prometheus.NewRegistry()
	logs := &syncbuf.Buffer{}
	r := start(t, Options{Transport: transport, MaxConnections: 2, Registerer: reg, Logger: slog.New(slog.NewTextHandler(logs, nil))}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if resp, err := r.client.ShouldRateLimit(ctx, rlReq("gz"), grpc.UseCompressor(gzip.Name)); err != nil || resp.OverallCode != rlpb.RateLimitResponse_OK {
		t.Fatalf("gzip call: %v %v", resp, err)
	}
	g, _, _, _ := r.srv.Addrs()
	second, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if _, err := rlpb.NewRateLimitServiceClient(second).ShouldRateLimit(ctx, rlReq("b")); err != nil {
		t.Fatalf("second connection: %v", err)
	}
	third, err := net.Dial("tcp", g.String())
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	_ = third.SetDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(third); err != nil || len(b) != 0 {
		t.Errorf("third connection read %d bytes, %v: want closed at accept", len(b), err)
	}
	st := r.srv.GRPCStats()
	if st.Open != 2 || st.Refused != 1 || st.Accepted != 2 {
		t.Errorf("stats %+v", st)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[mf.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	if got["ratelimit_grpc_connections_open"] != 2 || got["ratelimit_grpc_connections_refused_total"] != 1 || got["ratelimit_grpc_max_connections"] != 2 {
		t.Errorf("metrics %v", got)
	}
	if n := strings.Count(logs.String(), "connections refused at GRPC_MAX_CONNECTIONS"); n != 1 {
		t.Errorf("%d refusal log lines, want 1:\n%s", n, logs)
	}
}

// worstLag stops p and returns the worst scheduling lag it saw.
func worstLag(p *schedtest.Probe) time.Duration {
	_, worst := p.Stop()
	return worst
}

func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHealthcheckSaysWhy: an unhealthy /healthcheck names every unhealthy
// component and its reason; a component back to health leaves the body.
func TestHealthcheckSaysWhy(t *testing.T) {
	r := start(t, Options{}, nil)
	h := r.srv.Health()
	h.FailBecause(ComponentStore, "valkey has not answered since start (valkey standalone 10.0.0.1:6379)")
	h.Fail(ComponentShutdown)
	code, body := httpGet(t, r.http+"/healthcheck")
	want := "unhealthy\nredis: valkey has not answered since start (valkey standalone 10.0.0.1:6379)\nsigterm: shutting down\n"
	if code != 500 || body != want {
		t.Fatalf("healthcheck: %d %q, want 500 %q", code, body, want)
	}
	h.OK(ComponentStore)
	if _, body := httpGet(t, r.http+"/healthcheck"); body != "unhealthy\nsigterm: shutting down\n" {
		t.Fatalf("after the store recovered: %q", body)
	}
}

// TestDebugIndexListsOnlyWhatAnswers: every path the debug index lists
// answers (not 404), with and without the embedded ledger.
func TestDebugIndexListsOnlyWhatAnswers(t *testing.T) {
	for _, withLedger := range []bool{false, true} {
		o := Options{}
		if withLedger {
			o.Ledger = ledger.NewMemory("", nil)
		}
		r := start(t, o, nil)
		code, index := httpGet(t, r.debug+"/")
		if code != 200 {
			t.Fatalf("index: %d", code)
		}
		listed := 0
		for _, line := range strings.Split(strings.TrimSpace(index), "\n") {
			path, _, _ := strings.Cut(line, ": ")
			u := r.debug + path
			if strings.HasSuffix(path, "/profile") || strings.HasSuffix(path, "/trace") {
				u += "?seconds=1" // pprof's default is 30 s
			}
			if code, body := httpGet(t, u); code == http.StatusNotFound {
				t.Errorf("ledger %t: the index lists %s, which answers 404 %q", withLedger, path, body)
			}
			listed++
		}
		if withLedger != strings.Contains(index, "/ledger/keys") || listed < 5 {
			t.Fatalf("ledger %t: index %q", withLedger, index)
		}
	}
}
