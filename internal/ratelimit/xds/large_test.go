package xds_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/budgetgen/budgetgen/internal/ratelimit/xds"
)

// egListenerConfig is one listener's config shaped as Envoy Gateway's
// translator shapes it (internal/xds/translator/ratelimit.go,
// BuildRateLimitServiceConfig): the listener's name as domain, one route
// descriptor per route (key and value
// httproute/<ns>/<route>/rule/<i>/match/<j>/<host>), under it the rule's
// distinct header match (key only) holding the limit.
func egListenerConfig(listener string, routes int) *rlsconfv3.RateLimitConfig {
	c := &rlsconfv3.RateLimitConfig{Name: listener, Domain: listener}
	for r := range routes {
		route := fmt.Sprintf("httproute/tenants/route-%05d/rule/0/match/0/api-%05d_tenants_example_com", r, r)
		c.Descriptors = append(c.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: route, Value: route,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "rule-0-match-0",
				RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: uint32(1000 + r)}}}})
	}
	return c
}

// Envoy Gateway sends every domain in one response. Thirty thousand route
// rules over forty listeners come to more than grpc-go's default 4 MiB
// receive limit (the reference's default: XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES
// unset) and well within the client's 16 MiB; they are applied whole.
func TestLargeConfigWithinTheMessageLimit(t *testing.T) {
	const listeners, routes = 40, 750
	cfgs := make([]*rlsconfv3.RateLimitConfig, listeners)
	resp := &discoveryv3.DiscoveryResponse{TypeUrl: xds.TypeURL}
	for i := range cfgs {
		cfgs[i] = egListenerConfig(fmt.Sprintf("envoy-gateway-system/eg/http-%02d", i), routes)
		a, err := anypb.New(cfgs[i])
		if err != nil {
			t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	size := proto.Size(resp)
	if size <= 4<<20 || size >= xds.DefaultMaxRecvMsgSize/2 {
		t.Fatalf("response of %d bytes; the test wants one above 4 MiB and well below the limit", size)
	}
	eg := startEG(t, "127.0.0.1:0", nil)
	eg.set("1", cfgs...)
	var got applied
	c, err := xds.New(xds.Options{ServerURL: eg.addr, Apply: got.apply, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go func() { _ = c.Run(ctx) }()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("a %d-byte config was not applied: %v (stats %+v)", size, err, c.Stats())
	}
	if st := c.Stats(); st.Acks != 1 || st.StreamErrors != 0 {
		t.Errorf("stats %+v", st)
	}
}

// A response over the receive limit never reaches the client: grpc-go
// fails the stream with ResourceExhausted, so it cannot be NACKed, and the
// server sends it again on every new stream. It is a config not in force
// all the same, so it is reported as a rejected one (Options.Rejected, the
// service's config load metrics), and the backoff keeps growing; the next
// version that fits is applied.
func TestConfigOverTheLimitIsReportedAsRejected(t *testing.T) {
	big := egListenerConfig("envoy-gateway-system/eg/http", 600)
	if proto.Size(big) < 64<<10 {
		t.Fatalf("config of %d bytes, want one over 64 KiB", proto.Size(big))
	}
	eg := startEG(t, "127.0.0.1:0", nil)
	eg.set("1", big)
	rejected := make(chan error, 64)
	var got applied
	c, err := xds.New(xds.Options{ServerURL: eg.addr, Apply: got.apply, Logger: quietLogger(), MaxRecvMsgSize: 64 << 10,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		Rejected: func(err error) { rejected <- err }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() { _ = c.Run(ctx) }()
	select {
	case err := <-rejected:
		if !strings.Contains(err.Error(), "larger than max") {
			t.Errorf("rejected with %v; want the size named", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("a response over the limit was not reported; stats %+v", c.Stats())
	}
	eg.set("2", cfg("llm/budgets", 2))
	eventually(t, "version 2, which fits", func() bool { return c.Version() == "2" })
}
