package tlsconfig_test

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/tlsconfig"
	"github.com/budgetgen/budgetgen/internal/tlsconfig/tlstest"
)

// serve accepts TLS connections on loopback and answers each with the peer's
// certificate common name (or "-"), until the test ends.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				tc := c.(*tls.Conn)
				if err := tc.Handshake(); err != nil {
					return
				}
				name := "-"
				if pc := tc.ConnectionState().PeerCertificates; len(pc) > 0 {
					name = pc[0].Subject.CommonName
				}
				_, _ = io.WriteString(tc, name+"\n")
			})
		}
	})
	return ln.Addr().String()
}

// call dials addr and returns the server's answer and certificate name.
func call(addr string, cfg *tls.Config) (answer, serverName string, err error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c) // with TLS 1.3 a refused client certificate shows up here
	if err != nil {
		return "", "", err
	}
	return strings.TrimSpace(string(b)), c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "eg")
	srv := ca.Server("envoy-ratelimit")
	cli := ca.Client("envoy")
	other := tlstest.NewCA(t, dir, "other").Client("intruder")

	cfg, err := tlsconfig.Server(tlsconfig.ServerOptions{CertFile: srv.CertFile, KeyFile: srv.KeyFile, CAFile: ca.CertFile})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)

	good, err := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: cli.CertFile, KeyFile: cli.KeyFile, CAFile: ca.CertFile, ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	ans, sn, err := call(addr, good)
	if err != nil || ans != "envoy" || sn != "envoy-ratelimit" {
		t.Fatalf("mTLS call = %q %q %v; want the server to see the client certificate", ans, sn, err)
	}

	noCert, err := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: ca.CertFile, ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	if ans, _, err := call(addr, noCert); err == nil {
		t.Errorf("client without a certificate was served: %q", ans)
	}
	wrongCA, err := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: other.CertFile, KeyFile: other.KeyFile, CAFile: ca.CertFile, ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	if ans, _, err := call(addr, wrongCA); err == nil {
		t.Errorf("client with a certificate from another CA was served: %q", ans)
	}
	// The client checks the server too: a client trusting another CA refuses.
	distrust, _ := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: cli.CertFile, KeyFile: cli.KeyFile, CAFile: filepath.Join(dir, "other-ca.crt"), ServerName: "localhost"})
	if _, _, err := call(addr, distrust); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("server with an untrusted certificate accepted: %v", err)
	}
}

func TestServerWithoutCAAsksNoClientCert(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "eg")
	srv := ca.Server("rls")
	cfg, err := tlsconfig.Server(tlsconfig.ServerOptions{CertFile: srv.CertFile, KeyFile: srv.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	c, _ := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: ca.CertFile, ServerName: "localhost"})
	if ans, _, err := call(addr, c); err != nil || ans != "-" {
		t.Errorf("call = %q, %v; want served without a client certificate", ans, err)
	}
}

func TestServerReloadsRotatedFilesAndKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "eg")
	srv := ca.Server("first")
	cli := ca.Client("envoy")
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func() { mu.Lock(); now = now.Add(time.Minute); mu.Unlock() }

	cfg, err := tlsconfig.Server(tlsconfig.ServerOptions{CertFile: srv.CertFile, KeyFile: srv.KeyFile, CAFile: ca.CertFile, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	client, _ := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: cli.CertFile, KeyFile: cli.KeyFile, CAFile: ca.CertFile, ServerName: "localhost"})
	if _, sn, err := call(addr, client); err != nil || sn != "first" {
		t.Fatalf("first = %q %v", sn, err)
	}

	// Rotate: issue "second" and copy it over the served files.
	second := ca.Server("second")
	copyFile(t, second.CertFile, srv.CertFile)
	copyFile(t, second.KeyFile, srv.KeyFile)
	if _, sn, _ := call(addr, client); sn != "first" {
		t.Errorf("reloaded before the interval: %q", sn)
	}
	advance()
	if _, sn, err := call(addr, client); err != nil || sn != "second" {
		t.Fatalf("after rotation = %q %v, want second", sn, err)
	}

	// A half-written rotation (a key that does not match): keep serving the last good pair.
	third := ca.Server("third")
	copyFile(t, third.CertFile, srv.CertFile)
	advance()
	if _, sn, err := call(addr, client); err != nil || sn != "second" {
		t.Fatalf("with a mismatched key = %q %v, want the last good (second)", sn, err)
	}
	copyFile(t, third.KeyFile, srv.KeyFile)
	advance()
	if _, sn, err := call(addr, client); err != nil || sn != "third" {
		t.Fatalf("after completing = %q %v, want third", sn, err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	// Make sure the size or time changes even on coarse file systems.
	tlstest.WriteFile(t, to, b)
	later := time.Now().Add(time.Duration(len(b)) * time.Millisecond)
	_ = os.Chtimes(to, later, later)
}

func TestErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "eg")
	srv := ca.Server("s")
	other := ca.Server("o")
	garbage := filepath.Join(dir, "garbage.pem")
	tlstest.WriteFile(t, garbage, []byte("not pem"))
	missing := filepath.Join(dir, "missing.crt")
	cases := []struct {
		name string
		err  func() error
		want []string
	}{
		{"missing cert", func() error {
			_, err := tlsconfig.Server(tlsconfig.ServerOptions{CertFile: missing, KeyFile: srv.KeyFile})
			return err
		}, []string{"server TLS certificate", missing, "no such file"}},
		{"mismatched key", func() error {
			_, err := tlsconfig.Server(tlsconfig.ServerOptions{CertFile: srv.CertFile, KeyFile: other.KeyFile})
			return err
		}, []string{srv.CertFile, other.KeyFile, "private key does not match"}},
		{"CA without PEM", func() error {
			_, err := tlsconfig.Server(tlsconfig.ServerOptions{CertFile: srv.CertFile, KeyFile: srv.KeyFile, CAFile: garbage})
			return err
		}, []string{"TLS CA", garbage, "no PEM certificate"}},
		{"no key", func() error {
			_, err := tlsconfig.Server(tlsconfig.ServerOptions{CertFile: srv.CertFile})
			return err
		}, []string{"certificate and key files are both required"}},
		{"client cert without key", func() error {
			_, err := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: srv.CertFile})
			return err
		}, []string{"must be given together"}},
		{"client missing CA", func() error {
			_, err := tlsconfig.Client(tlsconfig.ClientOptions{CAFile: missing})
			return err
		}, []string{"TLS CA", missing}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.err()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// GRPC_CLIENT_TLS_SAN: with a CA and a ClientSAN, a client certificate of
// that CA is refused unless it names the SAN, as the reference's verifyClient
// (src/server/tls.go of envoyproxy/ratelimit) refuses it.
func TestClientSANIsRequired(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "eg")
	srv := ca.Server("envoy-ratelimit")
	envoy := ca.Client("envoy")
	other := ca.Client("other-workload")
	cfg, err := tlsconfig.Server(tlsconfig.ServerOptions{CertFile: srv.CertFile, KeyFile: srv.KeyFile, CAFile: ca.CertFile, ClientSAN: "envoy"})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg)
	client := func(p tlstest.Pair) *tls.Config {
		c, err := tlsconfig.Client(tlsconfig.ClientOptions{CertFile: p.CertFile, KeyFile: p.KeyFile, CAFile: ca.CertFile, ServerName: "localhost"})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if ans, _, err := call(addr, client(envoy)); err != nil || ans != "envoy" {
		t.Errorf("client naming the SAN = %q, %v; want served", ans, err)
	}
	if ans, _, err := call(addr, client(other)); err == nil {
		t.Errorf("client of the CA without the SAN was served: %q", ans)
	}
}
