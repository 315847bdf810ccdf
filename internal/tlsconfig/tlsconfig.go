// Package tlsconfig builds crypto/tls configurations from certificate, key and
// CA files, the way Envoy Gateway hands them to the rate limit service (files
// mounted from a Secret that cert rotation rewrites in place):
//
//   - Server: the gRPC server's TLS (GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT,
//     GRPC_SERVER_TLS_KEY, GRPC_SERVER_TLS_CA_CERT). With a CA, clients must
//     present a certificate signed by it (mTLS), as EG configures Envoy to do.
//   - Client: the xDS client's mTLS (CONFIG_GRPC_XDS_SERVER_USE_TLS,
//     CONFIG_GRPC_XDS_CLIENT_TLS_CERT/KEY, CONFIG_GRPC_XDS_SERVER_TLS_CACERT).
//
// Reload safety: the files are read and checked once at construction, so a bad
// path fails at start with a message naming the file. After that, the server
// re-reads a file when its modification time or size changes (checked at most
// once per ReloadInterval, on handshakes), and keeps serving the last good
// material if the new files are unreadable or mismatched, for example while a
// Secret update is half written. Client builds a fresh config on each call, so a
// client that calls it on every reconnect picks up rotated files.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// DefaultReloadInterval is how often, at most, the server checks its files.
const DefaultReloadInterval = 10 * time.Second

// ServerOptions names the server's files.
type ServerOptions struct {
	// CertFile and KeyFile hold the PEM certificate chain and private key. Required.
	CertFile, KeyFile string
	// CAFile, when set, holds the PEM CA certificates client certificates must
	// chain to; clients without a valid certificate are refused. Empty: no
	// client certificate is asked for.
	CAFile string
	// ClientSAN, when set with CAFile, is a name (DNS or IP SAN) the client
	// certificate must hold (GRPC_CLIENT_TLS_SAN), checked as the reference's
	// verifyClient does (src/server/tls.go of envoyproxy/ratelimit: x509
	// verification with DNSName set). Without CAFile no client certificate is
	// asked for, and it has no effect, as in the reference.
	ClientSAN string
	// ReloadInterval bounds how often the files are checked for changes.
	// Zero means DefaultReloadInterval; negative disables reloading.
	ReloadInterval time.Duration
	// Now is the clock used to rate-limit checks; nil means time.Now.
	Now func() time.Time
}

// ClientOptions names the client's files.
type ClientOptions struct {
	// CertFile and KeyFile hold the client certificate and key presented to the
	// server. Both or neither.
	CertFile, KeyFile string
	// CAFile holds the CA certificates the server's certificate must chain to.
	// Empty means the system roots.
	CAFile string
	// ServerName overrides the name checked in the server's certificate (by
	// default the host of the dialled address, as gRPC sets it).
	ServerName string
}

// Server returns a TLS configuration for a server. Files are checked now; the
// returned config re-reads them when they change (see the package doc).
func Server(o ServerOptions) (*tls.Config, error) {
	if o.CertFile == "" || o.KeyFile == "" {
		return nil, errors.New("server TLS: certificate and key files are both required")
	}
	if o.ReloadInterval == 0 {
		o.ReloadInterval = DefaultReloadInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	r := &reloader{o: o}
	if err := r.load(); err != nil {
		return nil, err
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	// GetConfigForClient lets the CA pool rotate too; GetCertificate alone
	// could only rotate the server's own pair.
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		st := r.current()
		c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*st.cert}}
		if st.pool != nil {
			c.ClientCAs = st.pool
			c.ClientAuth = tls.RequireAndVerifyClientCert
			if san := o.ClientSAN; san != "" {
				// Runs after the chain is verified. No certificate (a
				// config relaxed to VerifyClientCertIfGiven) is left to
				// the caller, which then sees no verified chain.
				c.VerifyConnection = func(cs tls.ConnectionState) error {
					if len(cs.PeerCertificates) == 0 {
						return nil
					}
					return cs.PeerCertificates[0].VerifyHostname(san)
				}
			}
		}
		return c, nil
	}
	return base, nil
}

// Client returns a TLS configuration for a client, read from the files now.
func Client(o ClientOptions) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.ServerName}
	switch {
	case o.CertFile != "" && o.KeyFile != "":
		cert, err := loadPair(o.CertFile, o.KeyFile, "client")
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{cert}
	case o.CertFile != "" || o.KeyFile != "":
		return nil, fmt.Errorf("client TLS: certificate file %q and key file %q must be given together", o.CertFile, o.KeyFile)
	}
	if o.CAFile != "" {
		pool, err := loadPool(o.CAFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	return c, nil
}

func loadPair(certFile, keyFile, role string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s TLS certificate: %w", role, err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s TLS key: %w", role, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s TLS certificate %s with key %s: %w", role, certFile, keyFile, err)
	}
	return cert, nil
}

func loadPool(caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("TLS CA %s: no PEM certificate found", caFile)
	}
	return pool, nil
}

type stamp struct {
	mod  time.Time
	size int64
}

func stat(path string) stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}
	}
	return stamp{fi.ModTime(), fi.Size()}
}

type material struct {
	cert   *tls.Certificate
	pool   *x509.CertPool
	stamps [3]stamp
}

// reloader holds the last good server material.
type reloader struct {
	o         ServerOptions
	mu        sync.Mutex
	cur       material
	lastCheck time.Time
	// lastErr is the error of the last failed reload (kept for tests and
	// debugging; the last good material stays in use).
	lastErr error
}

func (r *reloader) stamps() [3]stamp {
	s := [3]stamp{stat(r.o.CertFile), stat(r.o.KeyFile)}
	if r.o.CAFile != "" {
		s[2] = stat(r.o.CAFile)
	}
	return s
}

func (r *reloader) load() error {
	st := r.stamps()
	cert, err := loadPair(r.o.CertFile, r.o.KeyFile, "server")
	if err != nil {
		return err
	}
	m := material{cert: &cert, stamps: st}
	if r.o.CAFile != "" {
		if m.pool, err = loadPool(r.o.CAFile); err != nil {
			return err
		}
	}
	r.cur = m
	return nil
}

func (r *reloader) current() material {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.o.ReloadInterval < 0 {
		return r.cur
	}
	now := r.o.Now()
	if now.Sub(r.lastCheck) < r.o.ReloadInterval {
		return r.cur
	}
	r.lastCheck = now
	if r.stamps() != r.cur.stamps {
		prev := r.cur
		if err := r.load(); err != nil {
			r.cur, r.lastErr = prev, err
		} else {
			r.lastErr = nil
		}
	}
	return r.cur
}
