package service

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/budgetgen/budgetgen/internal/ratelimit/settings"
	"github.com/budgetgen/budgetgen/internal/ratelimit/source"
	"github.com/budgetgen/budgetgen/internal/ratelimit/xds"
	"github.com/budgetgen/budgetgen/internal/tlsconfig"
)

// InitialXDSConfigTimeout bounds the wait for the first xDS config when
// FORCE_START_WITHOUT_INITIAL_CONFIG is false (the reference waits forever;
// failing lets the orchestrator restart the pod and say why).
const InitialXDSConfigTimeout = 2 * time.Minute

// grpcServerTLS builds the gRPC server's TLS from GRPC_SERVER_TLS_CERT/KEY and
// the client CA (GRPC_SERVER_TLS_CA_CERT, which Envoy Gateway sets, or the
// reference's GRPC_CLIENT_TLS_CACERT): with a CA, clients must present a
// certificate it signed. Envoy Gateway's Envoy does (its SDS client cert).
func grpcServerTLS(s settings.Settings) (*tls.Config, error) {
	tc, err := tlsconfig.Server(tlsconfig.ServerOptions{CertFile: s.GRPCServerTLSCert, KeyFile: s.GRPCServerTLSKey, CAFile: s.GRPCClientTLSCACert, ClientSAN: s.GRPCClientTLSSAN})
	if err != nil {
		return nil, fmt.Errorf("GRPC_SERVER_USE_TLS: %w", err)
	}
	return tc, nil
}

// newXDSClient builds the CONFIG_TYPE=GRPC_XDS_SOTW config client; its
// configs go through applier (validated like files; a rejected one is NACKed
// and the last good one stays).
func newXDSClient(s settings.Settings, applier *source.Applier, log *slog.Logger) (*xds.Client, error) {
	o := xds.Options{ServerURL: s.XDSServerURL, NodeID: s.XDSNodeID, Apply: applier.ApplyProto, Logger: log, MaxRecvMsgSize: s.XDSClientMaxMsgSize,
		// A response that does not decode is rejected like a config that
		// does not validate: logged and counted, the last good one kept.
		Rejected: func(err error) { _ = applier.Apply("xds", nil, err) }}
	if s.XDSServerUseTLS {
		co := tlsconfig.ClientOptions{CertFile: s.XDSClientTLSCert, KeyFile: s.XDSClientTLSKey, CAFile: s.XDSServerTLSCACert, ServerName: s.XDSServerTLSSAN}
		// Fail at start on unreadable files; later connects re-read them.
		if _, err := tlsconfig.Client(co); err != nil {
			return nil, fmt.Errorf("CONFIG_GRPC_XDS_SERVER_USE_TLS: %w", err)
		}
		o.TLS = func() (*tls.Config, error) { return tlsconfig.Client(co) }
	}
	c, err := xds.New(o)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return c, nil
}

// waitFirstXDSConfig waits, unless FORCE_START_WITHOUT_INITIAL_CONFIG, for
// the first config, bounded by InitialXDSConfigTimeout.
func waitFirstXDSConfig(ctx context.Context, s settings.Settings, c *xds.Client) error {
	if s.ForceStartWithoutInitialConfig {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, InitialXDSConfigTimeout)
	defer cancel()
	if err := c.WaitReady(wctx); err != nil {
		return fmt.Errorf("initial config (set FORCE_START_WITHOUT_INITIAL_CONFIG=true to serve without one): %w", err)
	}
	return nil
}
