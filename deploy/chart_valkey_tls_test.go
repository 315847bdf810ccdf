package deploy

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/budgetgen/budgetgen/internal/ratelimit/service"
	"github.com/budgetgen/budgetgen/internal/tlsconfig/tlstest"
	"github.com/budgetgen/budgetgen/internal/valkeytest"
)

// valkeyCAFile is where the pod finds the file REDIS_TLS_CACERT names: the
// mount of the volume that carries it, and the item's path in it.
func valkeyCAFile(t *testing.T, dep *appsv1.Deployment) (string, corev1.Volume) {
	t.Helper()
	pod := dep.Spec.Template.Spec
	env := map[string]string{}
	for _, e := range pod.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["REDIS_TLS"] != "true" {
		t.Fatalf("REDIS_TLS = %q with valkey.tls", env["REDIS_TLS"])
	}
	ca := env["REDIS_TLS_CACERT"]
	for _, m := range pod.Containers[0].VolumeMounts {
		if !strings.HasPrefix(ca, m.MountPath+"/") {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			var items []corev1.KeyToPath
			switch {
			case v.Secret != nil:
				items = v.Secret.Items
			case v.ConfigMap != nil:
				items = v.ConfigMap.Items
			}
			if len(items) != 1 || filepath.Join(m.MountPath, items[0].Path) != ca {
				t.Fatalf("REDIS_TLS_CACERT %s is not the file volume %s puts at %s (%+v)", ca, v.Name, m.MountPath, items)
			}
			return ca, v
		}
	}
	t.Fatalf("REDIS_TLS_CACERT = %q: no volume is mounted there", ca)
	return "", corev1.Volume{}
}

// TestChartValkeyTLSWithPrivateCA: valkey.caCert mounts a Secret's or a
// ConfigMap's key as the file REDIS_TLS_CACERT names, and a pod so
// configured connects over TLS to a real Valkey whose certificate a private
// CA issued (ready: Valkey answered), while the same pod without it (system
// roots) stops at start. Values that cannot work are refused at install.
func TestChartValkeyTLSWithPrivateCA(t *testing.T) {
	dep, _ := chartObjects(t, "valkey.tls=true", "valkey.caCert.secretName=valkey-ca")
	if _, v := valkeyCAFile(t, dep); v.Secret == nil || v.Secret.SecretName != "valkey-ca" || v.Secret.Items[0].Key != "ca.crt" {
		t.Errorf("caCert.secretName: volume %+v, want Secret valkey-ca, key ca.crt", v)
	}
	dep, _ = chartObjects(t, "valkey.tls=true", "valkey.caCert.configMapName=valkey-ca-bundle", "valkey.caCert.key=bundle.pem")
	if _, v := valkeyCAFile(t, dep); v.ConfigMap == nil || v.ConfigMap.Name != "valkey-ca-bundle" || v.ConfigMap.Items[0].Key != "bundle.pem" {
		t.Errorf("caCert.configMapName: volume %+v, want ConfigMap valkey-ca-bundle, key bundle.pem", v)
	}
	helmRefuses(t, "valkey.caCert is set but valkey.tls is false", "--values", exampleValues, "--set", "valkey.caCert.secretName=valkey-ca")
	helmRefuses(t, "valkey.caCert: set secretName or configMapName, not both", "--values", exampleValues, "--set", "valkey.tls=true",
		"--set", "valkey.caCert.secretName=a", "--set", "valkey.caCert.configMapName=b")
	helmRefuses(t, "invalid propertyName 'REDIS_TLS_CACERT'", "--values", exampleValues, "--set", "env.REDIS_TLS_CACERT=/tmp/ca.crt")

	// A real Valkey serving TLS with a certificate of a private CA.
	ca := tlstest.NewCA(t, t.TempDir(), "valkey-private-ca")
	pair := ca.Server("valkey")
	caPEM, err := os.ReadFile(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	tlsPort := valkeytest.FreePort(t)
	valkeytest.Start(t, valkeytest.Options{Args: []string{"--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", pair.CertFile, "--tls-key-file", pair.KeyFile, "--tls-ca-cert-file", ca.CertFile, "--tls-auth-clients", "no"}})
	addr := "127.0.0.1:" + strconv.Itoa(tlsPort)
	secrets := map[string]map[string][]byte{"valkey-ca": {"ca.crt": caPEM}}
	p := startChartPod(t, map[string]string{"REDIS_URL": addr}, secrets, "valkey.tls=true", "valkey.caCert.secretName=valkey-ca")
	readiness := p.dep.Spec.Template.Spec.Containers[0].ReadinessProbe
	err = probe(readiness, p.ports)
	for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond) // the first connection is made in the background
		err = probe(readiness, p.ports)
	}
	if err != nil {
		t.Fatalf("not ready with Valkey's CA mounted from the Secret: %v\n%s", err, p.logs)
	}
	if !strings.Contains(p.logs.String(), "tls=true") {
		t.Errorf("the start-up log does not say Valkey is reached over TLS:\n%s", p.logs)
	}

	// The same pod trusting the system roots only: Valkey's certificate is
	// refused, and the service stops at start saying why.
	_, env := preparePod(t, map[string]string{"REDIS_URL": addr}, nil, "valkey.tls=true")
	if _, ok := env["REDIS_TLS_CACERT"]; ok {
		t.Fatalf("REDIS_TLS_CACERT set without valkey.caCert: %q", env["REDIS_TLS_CACERT"])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = service.Run(ctx, nil, func(k string) string { return env[k] }, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("without Valkey's CA: Run = %v, want a start-up error saying the certificate's authority is unknown", err)
	}
}

// TestChartValkeyClientCertificate: valkey.clientCert mounts a TLS
// Secret's tls.crt and tls.key as the files REDIS_TLS_CLIENT_CERT and
// REDIS_TLS_CLIENT_KEY name, and a pod so configured is served by a real
// Valkey that requires client certificates (tls-auth-clients yes). The
// client pair is refused without valkey.tls, and in env.
func TestChartValkeyClientCertificate(t *testing.T) {
	helmRefuses(t, "valkey.clientCert is set but valkey.tls is false", "--values", exampleValues, "--set", "valkey.clientCert.secretName=valkey-client")
	helmRefuses(t, "invalid propertyName 'REDIS_TLS_CLIENT_KEY'", "--values", exampleValues, "--set", "env.REDIS_TLS_CLIENT_KEY=/tmp/key.pem")

	ca := tlstest.NewCA(t, t.TempDir(), "valkey-private-ca")
	pair, client := ca.Server("valkey"), ca.Client("budgetgen-ratelimit")
	tlsPort := valkeytest.FreePort(t)
	valkeytest.Start(t, valkeytest.Options{Args: []string{"--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", pair.CertFile, "--tls-key-file", pair.KeyFile, "--tls-ca-cert-file", ca.CertFile, "--tls-auth-clients", "yes"}})
	read := func(f string) []byte {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	secrets := map[string]map[string][]byte{"valkey-ca": {"ca.crt": read(ca.CertFile)},
		"valkey-client": {"tls.crt": read(client.CertFile), "tls.key": read(client.KeyFile)}}
	p := startChartPod(t, map[string]string{"REDIS_URL": "127.0.0.1:" + strconv.Itoa(tlsPort)}, secrets,
		"valkey.tls=true", "valkey.caCert.secretName=valkey-ca", "valkey.clientCert.secretName=valkey-client")
	readiness := p.dep.Spec.Template.Spec.Containers[0].ReadinessProbe
	err := probe(readiness, p.ports)
	for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond) // the first connection is made in the background
		err = probe(readiness, p.ports)
	}
	if err != nil {
		t.Fatalf("not ready with the client certificate mounted from the Secret: %v\n%s", err, p.logs)
	}
}
