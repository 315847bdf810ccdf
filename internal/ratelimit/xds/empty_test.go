package xds_test

import (
	"context"
	"testing"
	"time"

	cachetypes "github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/budgetgen/budgetgen/internal/ratelimit/xds"
)

// setRaw stores a snapshot built from resources as given, so a test can
// publish what Envoy Gateway's runner publishes when its cache is empty.
func (s *egServer) setRaw(version string, resources map[resourcev3.Type][]cachetypes.Resource) {
	s.t.Helper()
	snap, err := cachev3.NewSnapshot(version, resources)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), "envoy-ratelimit", snap); err != nil {
		s.t.Fatal(err)
	}
}

// When the last rate limit policy goes, Envoy Gateway's runner
// (internal/globalratelimit/runner/runner.go, buildXDSResourceFromCache)
// publishes a snapshot whose rate limit type holds nothing: with the type
// present but empty while a Gateway is left, and without the type at all
// once the last Gateway goes, which go-control-plane serves with an empty
// version_info. The reference loads an empty config and ACKs (its
// sendConfigs in src/provider/xds_grpc_sotw_provider.go); so must the
// client, and take the next config after it.
func TestEmptyUpdatesAreAppliedAndAcked(t *testing.T) {
	eg := startEG(t, "127.0.0.1:0", nil)
	eg.set("1", cfg("llm/budgets", 1))
	var got applied
	c, err := xds.New(xds.Options{ServerURL: eg.addr, Apply: got.apply, Logger: quietLogger(),
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() { _ = c.Run(ctx) }()
	eventually(t, "version 1", func() bool { return c.Version() == "1" })

	installs := func() int { got.mu.Lock(); defer got.mu.Unlock(); return got.calls }
	eg.setRaw("2", map[resourcev3.Type][]cachetypes.Resource{resourcev3.RateLimitConfigType: nil})
	eventually(t, "empty version 2 applied", func() bool { d, _ := got.get(); return c.Version() == "2" && d == "" })
	eg.set("3", cfg("team/other", 3))
	eventually(t, "version 3", func() bool { return c.Version() == "3" })
	before := installs()
	eg.setRaw("4", map[resourcev3.Type][]cachetypes.Resource{})
	eventually(t, "empty update without the type applied", func() bool { d, _ := got.get(); return installs() > before && d == "" })
	if v := c.Version(); v != "" {
		t.Errorf("version %q after a snapshot without the type; go-control-plane serves it as \"\"", v)
	}
	eg.set("5", cfg("llm/budgets", 5))
	eventually(t, "version 5 after the empty one", func() bool { d, l := got.get(); return c.Version() == "5" && d == "llm/budgets" && l == 5 })
	if st := c.Stats(); st.Nacks != 0 {
		t.Errorf("stats %+v: an empty update was NACKed", st)
	}
}
