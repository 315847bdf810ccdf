package valkey

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/budgetgen/budgetgen/internal/store"
	"github.com/budgetgen/budgetgen/internal/store/storetest"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

func TestBehaviourCluster(t *testing.T) {
	t.Parallel() // its own servers; no fault, no timing bound but the behaviour suite's generous one
	c := valkeytest.StartCluster(t, 3)
	storetest.Run(t, func(t *testing.T) store.Store {
		return mustNew(t, Options{Addresses: c.Addrs, Mode: Cluster})
	})
}

// TestClusterOneCallManySlots charges counters living on the three nodes in
// one call and checks each node holds its own.
func TestClusterOneCallManySlots(t *testing.T) {
	t.Parallel() // its own servers; no fault, no timing bound
	c := valkeytest.StartCluster(t, 3)
	s := mustNew(t, Options{Addresses: c.Addrs[:1], Mode: Cluster})
	exp := time.Now().Add(time.Hour)
	var cs []store.Counter
	for i := 0; i < 12; i++ {
		cs = append(cs, store.Counter{Key: "k" + strconv.Itoa(i), Hits: uint64(i + 1), ExpireAt: exp})
	}
	totals := make([]store.Result, len(cs))
	if err := s.Charge(context.Background(), cs, totals); err != nil {
		t.Fatal(err)
	}
	owners := map[string]bool{}
	for i, k := range cs {
		if totals[i].Total != k.Hits {
			t.Fatalf("total %d = %d", i, totals[i].Total)
		}
		slot, _ := valkeytest.Do(c.Addrs[0], "CLUSTER", "KEYSLOT", k.Key)
		n, _ := strconv.Atoi(slot)
		owner, err := valkeytest.SlotOwner(c.Addrs[0], n)
		if err != nil {
			t.Fatal(err)
		}
		owners[owner] = true
		if got, err := valkeytest.Do(owner, "GET", k.Key); err != nil || got != strconv.FormatUint(k.Hits, 10) {
			t.Fatalf("GET %s on its owner %s = %q, %v", k.Key, owner, got, err)
		}
	}
	if len(owners) < 2 {
		t.Fatalf("test keys landed on %d node(s); want several", len(owners))
	}
}

func TestBehaviourSentinel(t *testing.T) {
	t.Parallel() // its own servers; no fault, no timing bound but the behaviour suite's generous one
	set := valkeytest.StartSentinel(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		return mustNew(t, Options{Addresses: set.Sentinels, Mode: Sentinel, MasterSet: set.MasterSet})
	})
}

// TestTLSAndACL connects over TLS (certificates made here) as an ACL user
// limited to keys bg:*; a key outside is refused (so the user really is the
// ACL user), a wrong password fails without the password in the error.
func TestTLSAndACL(t *testing.T) {
	dir := t.TempDir()
	caPool, certFile, keyFile, caFile := makeCerts(t, dir)
	tlsPort := valkeytest.FreePort(t)
	const password = "pw-7f3a9c-secret"
	srv := valkeytest.Start(t, valkeytest.Options{Args: []string{
		"--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile,
		"--tls-auth-clients", "no",
		"--user", "budget", "on", ">" + password, "~bg:*", "+@all",
	}})
	_ = srv
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
	tlsConf := &tls.Config{RootCAs: caPool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	logger, logs := testLogger(t)
	// The store's own keys (call ids) start with the key prefix, as the
	// counters do: the user's key pattern covers both.
	s := mustNew(t, Options{Addresses: []string{addr}, Username: "budget", Password: password, TLS: tlsConf, Logger: logger, KeyPrefix: "bg:"})
	exp := time.Now().Add(time.Hour)
	totals := make([]store.Result, 1)
	for i := 1; i <= 3; i++ {
		if err := s.Charge(context.Background(), []store.Counter{{Key: "bg:a", Hits: 2, ExpireAt: exp}}, totals); err != nil {
			t.Fatalf("charge over TLS: %v", err)
		}
		if totals[0].Total != uint64(2*i) {
			t.Fatalf("total = %d", totals[0].Total)
		}
	}
	err := s.Charge(context.Background(), []store.Counter{{Key: "other", Hits: 1, ExpireAt: exp}}, totals)
	if err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("key outside the ACL user's pattern: err = %v, want NOPERM", err)
	}
	// Plain TCP to the TLS port fails, and a wrong password fails: neither
	// leaks the password.
	for _, o := range []Options{
		{Addresses: []string{addr}, Username: "budget", Password: password, DialTimeout: 300 * time.Millisecond},
		{Addresses: []string{addr}, Username: "budget", Password: password + "x", TLS: tlsConf},
	} {
		_, err := New(o)
		if err == nil {
			t.Fatal("connection without TLS or with a wrong password succeeded")
		}
		if strings.Contains(err.Error(), password) {
			t.Fatalf("password in error: %v", err)
		}
	}
	if strings.Contains(logs.String(), password) {
		t.Fatal("password in logs")
	}
}

func makeCerts(t *testing.T, dir string) (pool *x509.CertPool, certFile, keyFile, caFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "budgetgen test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	return pool, write("server.crt", "CERTIFICATE", der), write("server.key", "EC PRIVATE KEY", keyDER), write("ca.crt", "CERTIFICATE", caDER)
}
