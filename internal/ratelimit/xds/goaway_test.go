package xds_test

import (
	"context"
	"net"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/budgetgen/budgetgen/internal/ratelimit/xds"
)

// A server that ends connections with GOAWAY (here its MaxConnectionAge,
// as a proxy or a draining server does) resets the stream again and again.
// The client reconnects after its initial backoff each time, so the
// reconnect rate stays bounded (no busy loop), and the config published
// meanwhile still arrives.
func TestGoAwayReconnectsWithBackoff(t *testing.T) {
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	eg := &egServer{t: t, cache: cache}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: 200 * time.Millisecond, MaxConnectionAgeGrace: 50 * time.Millisecond}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(ctx, cache, nil))
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()
	eg.set("1", cfg("llm/budgets", 1))

	const initial = 100 * time.Millisecond
	c, err := xds.New(xds.Options{ServerURL: ln.Addr().String(), Apply: new(applied).apply, Logger: quietLogger(),
		BackoffInitial: initial, BackoffMax: time.Second, Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	eventually(t, "version 1", func() bool { return c.Version() == "1" })
	start, from := time.Now(), c.Stats().Connects
	eventually(t, "three more connections", func() bool { return c.Stats().Connects >= from+3 })
	eg.set("2", cfg("llm/budgets", 2))
	eventually(t, "version 2 across the resets", func() bool { return c.Version() == "2" })
	// Each connection lives at least 200 ms less grpc-go's 10% jitter plus
	// the 50 ms grace (grpc-go's drain makes it about a second), then the
	// client waits initial/2 (Rand 0): at most one connect per 300 ms, plus
	// slack. A client spinning on a reset stream counts hundreds.
	el, n := time.Since(start), c.Stats().Connects-from
	if limit := int(el/(300*time.Millisecond)) + 2; n > limit {
		t.Errorf("%d connects in %v: more than one per connection lifetime (%d)", n, el, limit)
	}
}
