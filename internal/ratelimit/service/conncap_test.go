package service

import (
	"testing"

	"github.com/budgetgen/budgetgen/internal/ratelimit/settings"
)

// TestConnectionCapOnByDefault: a service started with GRPC_MAX_CONNECTIONS
// unset caps its gRPC connections at settings.DefaultGRPCMaxConnections
// (each connection may hold its bounded bytes: without a cap, memory has
// no bound in total); only an explicit 0 lifts the cap. The transports'
// tests (server.TestTransportLimitsAndGzip, unarygrpc.TestMaxConnections)
// show a cap refusing the connection over it.
func TestConnectionCapOnByDefault(t *testing.T) {
	if settings.DefaultGRPCMaxConnections <= 0 {
		t.Fatalf("DefaultGRPCMaxConnections = %d, want a finite cap", settings.DefaultGRPCMaxConnections)
	}
	for _, tc := range []struct {
		env  map[string]string
		want int
	}{
		{nil, settings.DefaultGRPCMaxConnections},
		{map[string]string{"GRPC_MAX_CONNECTIONS": "0"}, 0},
		{map[string]string{"GRPC_MAX_CONNECTIONS": "300"}, 300},
	} {
		dir := t.TempDir()
		writeConfig(t, dir, "a.yaml", "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1000}\n")
		s := startService(t, dir, tc.env)
		if got := s.srv.GRPCStats().Max; got != tc.want {
			t.Errorf("GRPC_MAX_CONNECTIONS %v: the gRPC port's cap is %d, want %d", tc.env, got, tc.want)
		}
		if err := s.stop(); err != nil {
			t.Fatal(err)
		}
	}
}
