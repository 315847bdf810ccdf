package xds_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/budgetgen/budgetgen/internal/ratelimit/xds"
	"github.com/budgetgen/budgetgen/internal/tlsconfig"
)

// egSecret is one of the Secrets Envoy Gateway's certgen writes
// (internal/crypto/certgen.go of github.com/envoyproxy/gateway v1.9.1), as
// files mounted at /certs: tls.crt, tls.key and ca.crt.
type egSecret struct{ dir string }

func (s egSecret) cert() string { return filepath.Join(s.dir, "tls.crt") }
func (s egSecret) key() string  { return filepath.Join(s.dir, "tls.key") }
func (s egSecret) ca() string   { return filepath.Join(s.dir, "ca.crt") }

// egCerts issues what certgen issues: an RSA CA named "envoy-gateway", the
// controller's certificate for its Service names, and the rate limit
// pod's (common name "*") for "*.<namespace>"; RSA 2048 keys in PKCS #1,
// and no extended key usage at all (so either end may present them).
func egCerts(t *testing.T, namespace string) (controller, ratelimit egSecret) {
	t.Helper()
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "envoy-gateway"},
		NotBefore: now.Add(-24 * time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageKeyEncipherment | x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		IsCA:     true, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(name, cn string, serial int64, dns ...string) egSecret {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-24 * time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageDataEncipherment | x509.KeyUsageKeyEncipherment | x509.KeyUsageContentCommitment,
			DNSNames: dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		s := egSecret{dir: filepath.Join(t.TempDir(), name)}
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for path, block := range map[string]*pem.Block{
			s.cert(): {Type: "CERTIFICATE", Bytes: der},
			s.key():  {Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)},
			s.ca():   {Type: "CERTIFICATE", Bytes: caDER},
		} {
			if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	svc := "envoy-gateway"
	controller = issue("envoy-gateway", "envoy-gateway", 2, svc, svc+"."+namespace, svc+"."+namespace+".svc", svc+"."+namespace+".svc.cluster.local")
	ratelimit = issue("envoy-rate-limit", "*", 3, "*."+namespace)
	return controller, ratelimit
}

// egServerTLS is the rate limit config server's TLS as Envoy Gateway builds
// it (internal/crypto/cert_load.go LoadTLSConfig): TLS 1.3 only, a client
// certificate from the CA required, files read on every handshake.
func egServerTLS(t *testing.T, s egSecret) *tls.Config {
	t.Helper()
	load := func() (*tls.Config, error) {
		cert, err := tls.LoadX509KeyPair(s.cert(), s.key())
		if err != nil {
			return nil, err
		}
		ca, err := os.ReadFile(s.ca())
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		return &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool, MinVersion: tls.VersionTLS13}, nil
	}
	if _, err := load(); err != nil {
		t.Fatal(err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, ClientAuth: tls.RequireAndVerifyClientCert,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return load() }}
}

// The client with the files and address Envoy Gateway gives the rate limit
// Deployment (internal/infrastructure/kubernetes/ratelimit/resource.go:
// CONFIG_GRPC_XDS_SERVER_URL envoy-gateway:18001, the client pair and CA
// under /certs, no CONFIG_GRPC_XDS_SERVER_TLS_SAN) gets its config from a
// server holding certgen's certificates: the server name checked is the
// URL's host. A name the certificate does not hold is refused.
func TestEnvoyGatewayCertificateLayout(t *testing.T) {
	controller, ratelimit := egCerts(t, "envoy-gateway-system")
	eg := startEG(t, "127.0.0.1:0", egServerTLS(t, controller))
	eg.set("1", cfg("llm/budgets", 1))
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", eg.addr) // the Service's address
	})
	client := func(serverName string) *xds.Client {
		co := tlsconfig.ClientOptions{CertFile: ratelimit.cert(), KeyFile: ratelimit.key(), CAFile: ratelimit.ca(), ServerName: serverName}
		c, err := xds.New(xds.Options{
			ServerURL: "passthrough:///envoy-gateway:18001", NodeID: "envoy-ratelimit", Apply: new(applied).apply, Logger: quietLogger(),
			TLS:            func() (*tls.Config, error) { return tlsconfig.Client(co) },
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond, DialOptions: []grpc.DialOption{dialer},
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	good := client("")
	go func() { _ = good.Run(ctx) }()
	if err := good.WaitReady(ctx); err != nil {
		t.Fatalf("no config with Envoy Gateway's certificates: %v (stats %+v)", err, good.Stats())
	}
	wrong := client("envoy-gateway.other-namespace")
	go func() { _ = wrong.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer wcancel()
	if err := wrong.WaitReady(wctx); err == nil {
		t.Error("a server name the certificate does not hold was accepted")
	}
}
