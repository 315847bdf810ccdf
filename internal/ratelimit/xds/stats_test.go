package xds_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"

	"github.com/budgetgen/budgetgen/internal/ratelimit/xds"
)

// runClient starts a client with short backoffs on o (Apply and Logger
// defaulted); the test's cleanup stops it.
func runClient(t *testing.T, o xds.Options) *xds.Client {
	t.Helper()
	if o.Apply == nil {
		o.Apply = new(applied).apply
	}
	if o.BackoffInitial == 0 {
		o.BackoffInitial, o.BackoffMax = 20*time.Millisecond, 100*time.Millisecond
	}
	o.Logger = quietLogger()
	c, err := xds.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// The stats say whether a stream is up now, when a response last came, and
// why streams ended: up while Envoy Gateway's server runs, down (a broken
// stream, then refused connections) while it is stopped, up again with
// the restarted server's config.
func TestStatsFollowTheStream(t *testing.T) {
	eg := startEG(t, "127.0.0.1:0", nil)
	eg.set("1", cfg("llm/budgets", 1))
	start := time.Now()
	c := runClient(t, xds.Options{ServerURL: eg.addr})
	eventually(t, "version 1", func() bool { return c.Version() == "1" })
	st := c.Stats()
	if !st.Up || st.Attempts != 1 || st.Connects != 1 || st.StreamErrors != 0 || st.LastReceived.Before(start) {
		t.Fatalf("connected: stats %+v; want up, one attempt, no error, a response since the start", st)
	}
	for _, r := range xds.StreamErrorReasons {
		if st.ErrorReasons[r] != 0 {
			t.Errorf("connected: %s errors %d", r, st.ErrorReasons[r])
		}
	}

	addr, received := eg.addr, st.LastReceived
	eg.stop()
	eventually(t, "the stream down and reconnects refused", func() bool {
		st := c.Stats()
		return !st.Up && st.ErrorReasons[xds.ReasonConnect] >= 2
	})
	st = c.Stats()
	// An attempt may be under way: counted, its error not yet.
	if inFlight := st.Attempts - st.StreamErrors; st.ErrorReasons[xds.ReasonBroken] != 1 || inFlight < 0 || inFlight > 1 || !st.LastReceived.Equal(received) {
		t.Errorf("server stopped: stats %+v; want the open stream broken once, every later attempt failed, no response", st)
	}
	sum := 0
	for _, n := range st.ErrorReasons {
		sum += n
	}
	if sum != st.StreamErrors {
		t.Errorf("errors by reason %v add up to %d, want StreamErrors %d", st.ErrorReasons, sum, st.StreamErrors)
	}

	restarted := time.Now()
	eg2 := startEG(t, addr, nil)
	eg2.set("1", cfg("restarted/policy", 2))
	eventually(t, "up with the restarted server's config", func() bool {
		st := c.Stats()
		return st.Up && st.LastReceived.After(restarted)
	})
	if st := c.Stats(); st.Connects != 2 {
		t.Errorf("restarted: %d connects, want 2", st.Connects)
	}
}

// closingADS ends every stream as soon as the client subscribes, the way
// go-control-plane's handler does when its server stops: status OK.
type closingADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
}

func (closingADS) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	_, err := st.Recv()
	return err
}

// Every way a stream ends is counted under its reason.
func TestStreamErrorReasons(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	unreachable := closed.Addr().String()
	closed.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, closingADS{})
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)

	big := startEG(t, "127.0.0.1:0", nil)
	big.set("1", egListenerConfig("envoy-gateway-system/eg/http", 600))

	for _, tc := range []struct {
		reason string
		o      xds.Options
	}{
		{xds.ReasonConnect, xds.Options{ServerURL: unreachable}},
		{xds.ReasonTLSConfig, xds.Options{ServerURL: unreachable, TLS: func() (*tls.Config, error) { return nil, errors.New("no such file") }}},
		{xds.ReasonClosed, xds.Options{ServerURL: ln.Addr().String()}},
		{xds.ReasonTooLarge, xds.Options{ServerURL: big.addr, MaxRecvMsgSize: 64 << 10}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			c := runClient(t, tc.o)
			eventually(t, "two errors", func() bool { return c.Stats().StreamErrors >= 2 })
			st := c.Stats()
			if st.ErrorReasons[tc.reason] < 2 || st.Acks != 0 {
				t.Errorf("stats %+v; want every error a %s, nothing applied", st, tc.reason)
			}
			for r, n := range st.ErrorReasons {
				if r != tc.reason && n != 0 {
					t.Errorf("%d errors of reason %s", n, r)
				}
			}
		})
	}
}
