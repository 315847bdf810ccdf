package service

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/budgetgen/budgetgen/internal/eventsink"
	"github.com/budgetgen/budgetgen/internal/ledger"
	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
	"github.com/budgetgen/budgetgen/internal/syncbuf"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

type svc struct {
	client rlpb.RateLimitServiceClient
	srv    *server.Server
	logs   *syncbuf.Buffer
	debug  string
	// stop cancels Run and returns its error (once; the cleanup calls it too).
	stop func() error
}

func startService(t *testing.T, dir string, env map[string]string, args ...string) *svc {
	t.Helper()
	logs := &syncbuf.Buffer{}
	base := map[string]string{"PORT": "0", "GRPC_PORT": "0", "DEBUG_PORT": "0", "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1", "CONFIG_POLL_INTERVAL": "20ms",
		"XDG_STATE_HOME": t.TempDir()} // the embedded store's default snapshot, this test's own
	if suiteTransport != "" {
		base["GRPC_SERVER_IMPL"] = suiteTransport
	}
	for k, v := range env {
		base[k] = v
	}
	getenv := func(k string) string { return base[k] }
	ready := make(chan *server.Server, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, append([]string{"--config-dir", dir}, args...), getenv, logs, func(s *server.Server) { ready <- s })
	}()
	var srv *server.Server
	select {
	case srv = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("service exited: %v\n%s", err, logs)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatalf("service did not start\n%s", logs)
	}
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("run: %v", err)
		}
	})
	g, _, d, _ := srv.Addrs()
	conn, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &svc{client: rlpb.NewRateLimitServiceClient(conn), srv: srv, logs: logs, debug: "http://" + d.String(), stop: stop}
}

// writeConfig replaces dir/name at once (a file written elsewhere, then
// renamed), as a ConfigMap update does: written in place, the service's
// watcher could read it half-written and count a rejected load the test
// did not make.
func writeConfig(t *testing.T, dir, name, body string) {
	t.Helper()
	tmp := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func call(t *testing.T, c rlpb.RateLimitServiceClient, domain string, kv ...string) *rlpb.RateLimitResponse {
	t.Helper()
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	resp, err := c.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second) // a reload under -race beside other jobs
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

func get(t *testing.T, url string) string {
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestRunWithoutValkeyHotReload: the service starts with no Valkey, says it
// uses the memory store, answers, reloads a changed config, and keeps the last
// good config when the new one is invalid (log line and metric).
func TestRunWithoutValkeyHotReload(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, "a.yaml", "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1}\n")
	s := startService(t, dir, map[string]string{"LOG_LEVEL": "info", "USE_STATSD": "true", "REDIS_POOL_SIZE": "3"})
	if !strings.Contains(s.logs.String(), "store=\"memory (embedded") {
		t.Fatalf("start-up log does not name the memory store:\n%s", s.logs)
	}
	for _, want := range []string{"USE_STATSD is set but ignored", "REDIS_POOL_SIZE is set but ignored"} {
		if !strings.Contains(s.logs.String(), want) {
			t.Fatalf("start-up log lacks %q:\n%s", want, s.logs)
		}
	}
	if r := call(t, s.client, "d", "user", "a"); r.OverallCode != rlpb.RateLimitResponse_OK {
		t.Fatalf("first: %v", r)
	}
	if r := call(t, s.client, "d", "user", "a"); r.OverallCode != rlpb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second: %v", r)
	}
	writeConfig(t, dir, "a.yaml", "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n")
	waitFor(t, "reload", func() bool {
		return call(t, s.client, "d", "user", "b").Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == 100
	})
	writeConfig(t, dir, "a.yaml", "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n")
	waitFor(t, "rejection metric", func() bool {
		return strings.Contains(get(t, s.debug+"/metrics"), `ratelimit_config_loads_total{result="error",source="file"} 1`)
	})
	if !strings.Contains(s.logs.String(), "config rejected; keeping the last good config") || !strings.Contains(s.logs.String(), "a.yaml") {
		t.Fatalf("no rejection log line naming the file:\n%s", s.logs)
	}
	if got := call(t, s.client, "d", "user", "c").Statuses[0].GetCurrentLimit().GetRequestsPerUnit(); got != 100 {
		t.Fatalf("limit after rejected reload = %d, want the last good 100", got)
	}
	m := get(t, s.debug+"/metrics")
	if !strings.Contains(m, "ratelimit_memory_counters ") {
		t.Fatal("memory store metrics not exported")
	}
	// The start-up snapshot was written: its time is exported, no failure.
	if strings.Contains(m, "ratelimit_memory_snapshot_last_success_timestamp_seconds 0\n") || !strings.Contains(m, "ratelimit_memory_snapshot_last_success_timestamp_seconds ") ||
		!strings.Contains(m, "ratelimit_memory_snapshot_failures_total 0\n") {
		t.Fatalf("snapshot metrics missing or wrong:\n%s", m)
	}
	if !strings.Contains(get(t, s.debug+"/rlconfig"), "requests_per_unit=100") {
		t.Fatal("/rlconfig does not show the active config")
	}
}

func TestRunRejectsBadSettings(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, "a.yaml", "domain: d\n")
	for name, tc := range map[string]struct {
		env  map[string]string
		want string
	}{
		"bad key format": {map[string]string{"KEY_FORMAT": "weird"}, "KEY_FORMAT: unknown key format"},
		"unix socket":    {map[string]string{"REDIS_URL": "/tmp/x.sock"}, "REDIS_SOCKET_TYPE"},
		"invalid config": {map[string]string{"RUNTIME_IGNOREDOTFILES": "true"}, "bad.yaml:2:1: nope: unknown key"},
	} {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{"PORT": "0", "GRPC_PORT": "0", "DEBUG_PORT": "0", "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1", "XDG_STATE_HOME": t.TempDir()}
			for k, v := range tc.env {
				env[k] = v
			}
			d := dir
			if name == "invalid config" {
				d = t.TempDir()
				writeConfig(t, d, "bad.yaml", "domain: d\nnope: 1\n")
			}
			err := Run(context.Background(), []string{"--config-dir", d}, func(k string) string { return env[k] }, io.Discard, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestRunValkeyCluster drives the service against a local 3-node cluster with
// the reference's cluster settings: keys of one request live in different
// slots and still go in one Charge.
func TestRunValkeyCluster(t *testing.T) {
	c := valkeytest.StartCluster(t, 3)
	dir := t.TempDir()
	writeConfig(t, dir, "a.yaml", "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 2}\n  - key: team\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	s := startService(t, dir, map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": strings.Join(c.Addrs, ","), "KEY_FORMAT": "envoy", "STORE_TIMEOUT": "1s"})
	if !strings.Contains(s.logs.String(), "valkey cluster") {
		t.Fatalf("start-up log does not name the cluster store:\n%s", s.logs)
	}
	for i := 0; i < 30; i++ {
		u := fmt.Sprint("user-", i)
		req := &rlpb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: u}}},
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "team", Value: u}}},
		}}
		for j, want := range []rlpb.RateLimitResponse_Code{rlpb.RateLimitResponse_OK, rlpb.RateLimitResponse_OVER_LIMIT, rlpb.RateLimitResponse_OVER_LIMIT} {
			resp, err := s.client.ShouldRateLimit(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode != want {
				t.Fatalf("%s call %d: %v", u, j, resp)
			}
		}
	}
	if !strings.Contains(get(t, s.debug+"/metrics"), "ratelimit_valkey_lost_hits_total 0") {
		t.Fatal("valkey store metrics not exported")
	}
	// Counters are spread over the nodes.
	nodesWithKeys := 0
	for _, a := range c.Addrs {
		if n, _ := valkeytest.Do(a, "DBSIZE"); n != "0" {
			nodesWithKeys++
		}
	}
	if nodesWithKeys < 2 {
		t.Fatalf("counters on %d nodes; expected them spread across the cluster", nodesWithKeys)
	}
}

// TestEmbeddedLedgerOnDebugPort: with the embedded store, the usage ledger
// lives in the service; its debug port serves it for budgetgen report
// --service, and it holds what was charged.
func TestEmbeddedLedgerOnDebugPort(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, "a.yaml", "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1000}\n")
	s := startService(t, dir, nil)
	for _, hits := range []uint32{30, 12} {
		d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}
		if _, err := s.client.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{d}, HitsAddend: hits}); err != nil {
			t.Fatal(err)
		}
	}
	rd := &ledger.HTTPReader{Base: s.debug}
	today := ledger.DayOf(time.Now())
	var data []ledger.Data
	waitFor(t, "the charges in the ledger", func() bool {
		var err error
		data, err = ledger.ReadAll(context.Background(), rd, []ledger.Window{ledger.DayWindow(today)})
		return err == nil && len(data) == 1 && data[0].Usage[ledger.EncodePrincipal1("alice")] == 42
	})
	if data[0].Rule.Domain != "d" {
		t.Fatalf("ledger %+v", data)
	}
	if !strings.Contains(get(t, s.debug+"/"), "/ledger/") {
		t.Fatal("debug index does not list /ledger/")
	}
}

// TestThresholdEventsLeaveTheProcess: with THRESHOLD_EVENTS_URL, a running
// service sends each 80/90/100% crossing as a CloudEvent to a receiver
// built with the CloudEvents Go SDK; the decisions are answered as without
// it.
func TestThresholdEventsLeaveTheProcess(t *testing.T) {
	events := make(chan cloudevents.Event, 16)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := cehttp.New(cehttp.WithListener(ln))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cloudevents.NewClient(p)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopReceiver := context.WithCancel(context.Background())
	received := make(chan error, 1)
	go func() {
		received <- rc.StartReceiver(rctx, func(ev cloudevents.Event) { events <- ev })
	}()
	defer func() { stopReceiver(); <-received }()
	rcvURL := "http://" + ln.Addr().String()
	dir := t.TempDir()
	writeConfig(t, dir, "a.yaml", "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 100}\n")
	s := startService(t, dir, map[string]string{"THRESHOLD_EVENTS_URL": rcvURL + "/budget-events?token=tok-secret-9"})
	// 85 then 100 of 100: crosses 80, then 90 and 100.
	for _, hits := range []uint32{85, 15} {
		d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}
		resp, err := s.client.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{d}, HitsAddend: hits})
		if err != nil || resp.OverallCode != rlpb.RateLimitResponse_OK {
			t.Fatalf("decision: %v %v", resp, err)
		}
	}
	seen := map[int]bool{}
	for len(seen) < 3 {
		select {
		case ev := <-events:
			var data eventsink.Crossing
			if err := ev.DataAs(&data); err != nil || ev.Validate() != nil || ev.SpecVersion() != "1.0" || ev.Type() != "dev.budgetgen.ratelimit.threshold.crossed" ||
				ev.ID() == "" || ev.Source() != "budgetgen/ratelimit" || ev.DataContentType() != "application/json" || data.Principal != "alice" || data.Cap != 100 ||
				time.Since(ev.Time()) > time.Minute {
				t.Fatalf("event %s (%v)", ev, err)
			}
			seen[data.ThresholdPercent] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("events seen %v\n%s", seen, s.logs)
		}
	}
	if !seen[80] || !seen[90] || !seen[100] {
		t.Fatalf("thresholds %v", seen)
	}
	metrics := get(t, s.debug+"/metrics")
	if !strings.Contains(metrics, `budgetgen_ratelimit_threshold_events_dropped_total{reason="queue_full"} 0`) {
		t.Fatalf("dropped metric missing:\n%s", metrics)
	}
	if strings.Contains(s.logs.String(), "tok-secret-9") {
		t.Fatal("the events URL's token is in the log")
	}
}
