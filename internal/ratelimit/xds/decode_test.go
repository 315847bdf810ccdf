package xds_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/budgetgen/budgetgen/internal/ratelimit/xds"
)

// scriptedADS answers the first requests of a stream with scripted responses
// and records every request; go-control-plane's server cannot send resources
// of the wrong type or bytes that do not decode.
type scriptedADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	responses []*discoveryv3.DiscoveryResponse
	requests  chan *discoveryv3.DiscoveryRequest
}

func (s *scriptedADS) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for i := 0; ; i++ {
		req, err := st.Recv()
		if err != nil {
			return err
		}
		s.requests <- req
		if i < len(s.responses) {
			if err := st.Send(s.responses[i]); err != nil {
				return err
			}
		}
	}
}

func TestNackUndecodableResources(t *testing.T) {
	good, err := anypb.New(cfg("llm/budgets", 1))
	if err != nil {
		t.Fatal(err)
	}
	ads := &scriptedADS{requests: make(chan *discoveryv3.DiscoveryRequest, 16), responses: []*discoveryv3.DiscoveryResponse{
		{VersionInfo: "1", Nonce: "n1", TypeUrl: xds.TypeURL, Resources: []*anypb.Any{good}},
		{VersionInfo: "2", Nonce: "n2", TypeUrl: xds.TypeURL, Resources: []*anypb.Any{{TypeUrl: xds.TypeURL, Value: []byte{0xff, 0xff, 0xff}}}},
		{VersionInfo: "3", Nonce: "n3", TypeUrl: xds.TypeURL, Resources: []*anypb.Any{{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"}}},
		{VersionInfo: "4", Nonce: "n4", TypeUrl: "type.googleapis.com/envoy.config.listener.v3.Listener"},
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, ads)
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()

	var applied atomic.Int32
	c, err := xds.New(xds.Options{
		ServerURL: ln.Addr().String(), Logger: quietLogger(),
		Apply: func(context.Context, []*rlsconfv3.RateLimitConfig) error { applied.Add(1); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() { _ = c.Run(ctx) }()

	next := func() *discoveryv3.DiscoveryRequest {
		select {
		case r := <-ads.requests:
			return r
		case <-ctx.Done():
			t.Fatal("no request")
			return nil
		}
	}
	if r := next(); r.ResponseNonce != "" || r.VersionInfo != "" {
		t.Errorf("subscribe = %v", r)
	}
	if r := next(); r.ResponseNonce != "n1" || r.VersionInfo != "1" || r.ErrorDetail != nil {
		t.Errorf("ACK of 1 = %v", r)
	}
	for _, want := range []struct{ nonce, reason string }{
		{"n2", "resource[0]: decode RateLimitConfig"},
		{"n3", "resource[0]: unexpected type_url"},
		{"n4", "unexpected type_url"},
	} {
		r := next()
		if r.ResponseNonce != want.nonce || r.VersionInfo != "1" || r.ErrorDetail == nil || !strings.Contains(r.ErrorDetail.Message, want.reason) {
			t.Errorf("NACK for %s = version %q detail %v; want version 1 and %q", want.nonce, r.VersionInfo, r.ErrorDetail, want.reason)
		}
	}
	if applied.Load() != 1 || c.Version() != "1" {
		t.Errorf("applied %d, version %q: bad responses reached the callback", applied.Load(), c.Version())
	}
}
