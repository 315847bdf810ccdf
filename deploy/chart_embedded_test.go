package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// embeddedValues installs the embedded store (no Valkey), one replica, its
// snapshot on a PersistentVolumeClaim.
const embeddedValues = chartDir + "/ci/embedded-values.yaml"

// embeddedObjects renders the chart with the embedded store's values file and
// returns the Deployment, the claims and the NetworkPolicies.
func embeddedObjects(t *testing.T, set ...string) (*appsv1.Deployment, []corev1.PersistentVolumeClaim, []networkingv1.NetworkPolicy) {
	t.Helper()
	args := []string{"template", "budgetgen-ratelimit", chartDir, "--namespace", namespace, "--values", embeddedValues}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	docs := splitDocs(t, runHelm(t, args...))
	validateAll(t, "helm template (embedded store)", docs)
	var dep *appsv1.Deployment
	var pvcs []corev1.PersistentVolumeClaim
	for _, doc := range docs {
		var m struct {
			Kind string `json:"kind"`
		}
		if err := sigsyaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		switch m.Kind {
		case "Deployment":
			dep = &appsv1.Deployment{}
			strict(t, "Deployment", doc, dep)
		case "PersistentVolumeClaim":
			var c corev1.PersistentVolumeClaim
			strict(t, "PersistentVolumeClaim", doc, &c)
			pvcs = append(pvcs, c)
		}
	}
	if dep == nil {
		t.Fatal("the chart renders no Deployment")
	}
	return dep, pvcs, networkPolicies(t, docs)
}

// snapshotVolume returns the volume the snapshot's directory is mounted
// from, failing unless it is mounted writable: the root filesystem is
// read-only, so the snapshot can only be written to a volume.
func snapshotVolume(t *testing.T, dep *appsv1.Deployment) corev1.Volume {
	t.Helper()
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Fatalf("the root filesystem is not read-only: %+v", c.SecurityContext)
	}
	var path string
	for _, e := range c.Env {
		switch e.Name {
		case "REDIS_URL", "REDIS_AUTH_FILE", "REDIS_TLS":
			t.Errorf("embedded store, yet %s is set: %+v", e.Name, e)
		case "MEMORY_SNAPSHOT_PATH":
			path = e.Value
		}
	}
	if path == "" || !filepath.IsAbs(path) {
		t.Fatalf("MEMORY_SNAPSHOT_PATH %q: the image's default is on the read-only root filesystem", path)
	}
	for _, m := range c.VolumeMounts {
		if filepath.Dir(path) != m.MountPath {
			continue
		}
		if m.ReadOnly {
			t.Fatalf("the snapshot's directory %s is mounted read-only", m.MountPath)
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name {
				return v
			}
		}
	}
	t.Fatalf("the snapshot %s is on no mounted volume (mounts %+v)", path, c.VolumeMounts)
	return corev1.Volume{}
}

// TestChartEmbeddedStore: with embedded.enabled the Deployment runs without
// Valkey: no Valkey settings, no egress to Valkey, the snapshot on a writable
// volume despite the read-only root filesystem, a PersistentVolumeClaim
// (the snapshot survives the pod) with embedded.persistence, an emptyDir
// otherwise (it survives container restarts only), and the Recreate strategy,
// so the old pod's last snapshot is written before the new one reads it.
func TestChartEmbeddedStore(t *testing.T) {
	dep, pvcs, nps := embeddedObjects(t)
	v := snapshotVolume(t, dep)
	if v.PersistentVolumeClaim == nil || len(pvcs) != 1 || v.PersistentVolumeClaim.ClaimName != pvcs[0].Name {
		t.Errorf("with embedded.persistence the snapshot's volume %+v must be the rendered claim (%d claims)", v, len(pvcs))
	}
	if dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("strategy %q: a rolling update starts the new pod before the old one writes its last snapshot", dep.Spec.Strategy.Type)
	}
	if sc := dep.Spec.Template.Spec.SecurityContext; sc == nil || sc.FSGroup == nil || *sc.FSGroup != 65534 {
		t.Errorf("pod securityContext %+v: without fsGroup 65534 the claim's root is not writable by uid 65534", sc)
	}
	for _, np := range nps {
		for _, e := range np.Spec.Egress {
			for _, p := range e.Ports {
				if p.Port != nil && p.Port.IntValue() == 6379 {
					t.Errorf("NetworkPolicy %s opens egress to Valkey, which the embedded store does not use", np.Name)
				}
			}
		}
	}
	dep, pvcs, _ = embeddedObjects(t, "embedded.persistence.enabled=false")
	if v := snapshotVolume(t, dep); v.EmptyDir == nil || len(pvcs) != 0 {
		t.Errorf("without embedded.persistence: volume %+v, %d claims; want an emptyDir and none", v, len(pvcs))
	}
	// Counts are per replica: two replicas would each grant the whole budget.
	helmRefuses(t, "embedded.enabled counts in each replica's memory", "--values", embeddedValues, "--set", "replicas=2", "--set", "podDisruptionBudget.enabled=false")
}

// TestChartEmbeddedStoreWritesItsSnapshot starts the service as the chart's
// embedded-store Deployment runs it and sees the snapshot written where the
// chart mounts its volume.
func TestChartEmbeddedStoreWritesItsSnapshot(t *testing.T) {
	set := []string{"embedded.enabled=true", "replicas=1", "podDisruptionBudget.enabled=false"}
	dep, env := preparePod(t, map[string]string{"MEMORY_SNAPSHOT_INTERVAL": "100ms"}, nil, set...)
	snapshotVolume(t, dep)
	path := env["MEMORY_SNAPSHOT_PATH"]
	if !strings.HasPrefix(path, os.TempDir()) {
		t.Fatalf("MEMORY_SNAPSHOT_PATH %q is not below the test's root", path)
	}
	_, logs := startChartServer(t, env)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot at %s after 10 s\n%s", path, logs)
		}
		time.Sleep(50 * time.Millisecond) // polls a file the service writes every 100ms
	}
}
