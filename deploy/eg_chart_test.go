package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// egChart copies Envoy Gateway's own Helm chart (charts/gateway-helm of the
// github.com/envoyproxy/gateway v1.9.1 module this repository pins) into a
// temporary directory, with values.yaml made from its values.tmpl.yaml as
// EG's release does (the two image placeholders filled).
func egChart(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/envoyproxy/gateway").Output()
	if err != nil {
		t.Fatalf("locate the Envoy Gateway module: %v", err)
	}
	src := filepath.Join(strings.TrimSpace(string(out)), "charts", "gateway-helm")
	dir := filepath.Join(t.TempDir(), "gateway-helm")
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	tmpl, err := os.ReadFile(filepath.Join(dir, "values.tmpl.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	values := strings.NewReplacer("${GatewayImage}", "docker.io/envoyproxy/gateway:v1.9.1", "${GatewayImagePullPolicy}", "IfNotPresent").Replace(string(tmpl))
	if err := os.WriteFile(filepath.Join(dir, "values.yaml"), []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestEnvoyGatewayChartMountsBudgetMap renders Envoy Gateway's chart with
// envoy-gateway/helm-values.yaml and reads back the EnvoyGateway config it
// installs: the rate limit Deployment EG manages runs our image, mounts the
// budget map ConfigMap the budgetgen-ratelimit chart creates, and reads it
// where that chart's own Deployment does (BUDGET_MAP_PATH), so both count a
// shared budget in one bucket.
func TestEnvoyGatewayChartMountsBudgetMap(t *testing.T) {
	stream := runHelm(t, "template", "eg", egChart(t), "--namespace", namespace, "--values", "envoy-gateway/helm-values.yaml")
	var cfg string
	for _, doc := range splitDocs(t, stream) {
		var cm corev1.ConfigMap
		if err := sigsyaml.Unmarshal(doc, &cm); err == nil && cm.Kind == "ConfigMap" && cm.Name == "envoy-gateway-config" {
			cfg = cm.Data["envoy-gateway.yaml"]
		}
	}
	if cfg == "" {
		t.Fatal("Envoy Gateway's chart rendered no envoy-gateway-config")
	}
	eg := loadEnvoyGateway(t, "envoy-gateway-config rendered by Envoy Gateway's chart", []byte(cfg))
	rd := eg.Provider.Kubernetes.RateLimitDeployment
	if rd == nil || rd.Container == nil || rd.Pod == nil || rd.Container.Image == nil || !strings.HasPrefix(*rd.Container.Image, "ghcr.io/budgetgen/ratelimit:") {
		t.Fatalf("rateLimitDeployment = %+v, want our image with pod volumes and container mounts", rd)
	}

	// The chart's Deployment: its budget map volume and path.
	dep, _ := chartObjects(t)
	c := dep.Spec.Template.Spec.Containers[0]
	wantPath, wantCM := "", ""
	for _, e := range c.Env {
		if e.Name == "BUDGET_MAP_PATH" {
			wantPath = e.Value
		}
	}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == "budget-map" && v.ConfigMap != nil {
			wantCM = v.ConfigMap.Name
		}
	}
	var gotPath string
	for _, e := range rd.Container.Env {
		if e.Name == "BUDGET_MAP_PATH" {
			gotPath = e.Value
		}
	}
	if gotPath == "" || gotPath != wantPath {
		t.Errorf("Envoy Gateway's Deployment reads the budget map at %q, the chart's at %q", gotPath, wantPath)
	}
	var mountVol string
	for _, m := range rd.Container.VolumeMounts {
		if strings.HasPrefix(gotPath, m.MountPath+"/") {
			mountVol = m.Name
		}
	}
	var gotCM string
	for _, v := range rd.Pod.Volumes {
		if v.Name == mountVol && v.ConfigMap != nil {
			gotCM = v.ConfigMap.Name
		}
	}
	if gotCM == "" || gotCM != wantCM {
		t.Errorf("Envoy Gateway's Deployment mounts ConfigMap %q at the budget map path, the chart creates %q", gotCM, wantCM)
	}
}
