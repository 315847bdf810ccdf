package assert

import (
	"context"
	"testing"
)

// TestVersionTableSharedCost: Envoy Gateway 1.8.0 and 1.8.1 drop the charged
// amount of shared rules with a cost (gateway issue 9244, fixed in 1.8.2);
// the versions around that range are not flagged.
func TestVersionTableSharedCost(t *testing.T) {
	fx := loadFixture(t, "testdata/rules/bg010_shared_cost.yaml")
	for v, want := range map[string]int{"v1.7.2": 0, "v1.8.0": 1, "1.8.1": 1, "v1.8.2": 0, "v1.9.1": 0, "v1.8.1-rc.1": 1} {
		opts := fx.opts
		opts.EnvoyGatewayVersion = v
		rep, err := Run(context.Background(), fx.objs, opts)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range rep.Findings {
			if f.Rule == "BG010" && f.Path == "spec.rateLimit.global.rules[0].shared" {
				n++
			}
		}
		if n != want {
			t.Errorf("EG %s: %d shared-cost findings, want %d", v, n, want)
		}
	}
}
