package service

import (
	"testing"

	"github.com/budgetgen/budgetgen/internal/ratelimit/server"
)

// suiteTransport, when set, is the GRPC_SERVER_IMPL every startService
// uses (an env entry of the test still wins). Set only by
// TestSuiteOnEachTransport, whose subtests run one at a time.
var suiteTransport string

// TestSuiteOnEachTransport runs the service tests that serve gRPC on every
// transport but the default, which the tests themselves run on: the whole
// suite passes on both, so an operator can switch without surprises.
func TestSuiteOnEachTransport(t *testing.T) {
	suite := []struct {
		name string
		f    func(*testing.T)
	}{
		{"RunWithoutValkeyHotReload", TestRunWithoutValkeyHotReload},
		{"RunValkeyCluster", TestRunValkeyCluster},
		{"EmbeddedLedgerOnDebugPort", TestEmbeddedLedgerOnDebugPort},
		{"ManyIdleConnectionsUnderFDLimit", TestManyIdleConnectionsUnderFDLimit},
	}
	for _, tr := range server.Transports {
		if tr == server.TransportLean {
			continue
		}
		t.Run(tr, func(t *testing.T) {
			suiteTransport = tr
			defer func() { suiteTransport = "" }()
			for _, tc := range suite {
				t.Run(tc.name, tc.f)
			}
		})
	}
}
