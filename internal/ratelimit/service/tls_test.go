package service

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/settings"
	"github.com/budgetgen/budgetgen/internal/tlsconfig"
	"github.com/budgetgen/budgetgen/internal/tlsconfig/tlstest"
)

// GRPC_CLIENT_TLS_SAN is documented as "SAN required in client
// certificates": the gRPC port must refuse a client certificate of the CA
// that does not hold it, as the reference's verifyClient does
// (src/server/tls.go of envoyproxy/ratelimit).
func TestGRPCClientTLSSANEnforced(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "eg")
	srv := ca.Server("envoy-ratelimit")
	s := settings.Settings{GRPCServerTLSCert: srv.CertFile, GRPCServerTLSKey: srv.KeyFile, GRPCClientTLSCACert: ca.CertFile, GRPCClientTLSSAN: "envoy"}
	tc, err := grpcServerTLS(s)
	if err != nil {
		t.Fatal(err)
	}
	handshake := func(p tlstest.Pair) error {
		cc, err := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: p.CertFile, KeyFile: p.KeyFile, CAFile: ca.CertFile, ServerName: "localhost"})
		if err != nil {
			t.Fatal(err)
		}
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		_ = a.SetDeadline(time.Now().Add(5 * time.Second))
		_ = b.SetDeadline(time.Now().Add(5 * time.Second))
		go func() {
			c := tls.Client(b, cc)
			if c.Handshake() == nil {
				_, _ = c.Read(make([]byte, 1)) // takes the server's alert, if any
			}
			_ = b.Close()
		}()
		return tls.Server(a, tc).Handshake() // with TLS 1.3 the server decides after the client is done
	}
	if err := handshake(ca.Client("envoy")); err != nil {
		t.Errorf("client holding the SAN refused: %v", err)
	}
	if err := handshake(ca.Client("intruder")); err == nil {
		t.Error("client certificate without GRPC_CLIENT_TLS_SAN accepted")
	}
}
