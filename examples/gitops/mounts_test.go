package gitops

import (
	"os"
	"path"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// TestBuildNamesTheMountedConfigMaps: `kustomize build deploy` holds the
// ConfigMaps both rate limit Deployments mount, under the names they mount
// (no hash suffix), with the files render wrote: the budgetgen-ratelimit
// Deployment of the build (rate limit configs and budget map) and the one
// Envoy Gateway manages, configured by the repository's
// deploy/envoy-gateway/helm-values.yaml (budget map). Both read the budget
// map at BUDGET_MAP_PATH inside the mount.
func TestBuildNamesTheMountedConfigMaps(t *testing.T) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "deploy")
	if err != nil {
		t.Fatalf("kustomize build deploy: %v", err)
	}
	configMaps := map[string]map[string]string{}
	var dep *appsv1.Deployment
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		switch r.GetKind() {
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.UnmarshalStrict(y, &cm); err != nil {
				t.Fatal(err)
			}
			configMaps[cm.Namespace+"/"+cm.Name] = cm.Data
		case "Deployment":
			dep = &appsv1.Deployment{}
			if err := yaml.UnmarshalStrict(y, dep); err != nil {
				t.Fatal(err)
			}
		}
	}
	if dep == nil {
		t.Fatal("the build deploys no rate limit Deployment for agentgateway")
	}
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	mounted := checkMounts(t, "budgetgen-ratelimit", dep.Namespace, pod.Volumes, c.VolumeMounts, c.Env, configMaps)
	config := configMaps[dep.Namespace+"/"+mounted["CONFIG_DIR"]]
	want, err := os.ReadFile("deploy/ratelimit/config/agents_ai-budgets-agent-gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if config["agents_ai-budgets-agent-gateway.yaml"] != string(want) {
		t.Errorf("the config ConfigMap does not hold agentgateway's rendered domain")
	}

	// Envoy Gateway's half: the values the platform installs Envoy Gateway with.
	data, err := os.ReadFile("../../deploy/envoy-gateway/helm-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Config struct {
			EnvoyGateway egv1a1.EnvoyGateway `json:"envoyGateway"`
		} `json:"config"`
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	rd := values.Config.EnvoyGateway.Provider.Kubernetes.RateLimitDeployment
	if rd == nil || rd.Pod == nil || rd.Container == nil {
		t.Fatal("helm-values.yaml sets no rateLimitDeployment pod volumes and container mounts")
	}
	checkMounts(t, "envoy-ratelimit", "envoy-gateway-system", rd.Pod.Volumes, rd.Container.VolumeMounts, rd.Container.Env, configMaps)
}

// checkMounts follows each path setting (BUDGET_MAP_PATH, CONFIG_DIR) to
// the volume mounted there and the ConfigMap behind it, which the build must
// hold. It returns setting -> ConfigMap name.
func checkMounts(t *testing.T, who, ns string, vols []corev1.Volume, mounts []corev1.VolumeMount, env []corev1.EnvVar, cms map[string]map[string]string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range env {
		if e.Name != "BUDGET_MAP_PATH" && e.Name != "CONFIG_DIR" {
			continue
		}
		var cm string
		for _, mt := range mounts {
			if e.Value == mt.MountPath || strings.HasPrefix(e.Value, mt.MountPath+"/") {
				for _, v := range vols {
					if v.Name == mt.Name && v.ConfigMap != nil {
						cm = v.ConfigMap.Name
					}
				}
			}
		}
		data, ok := cms[ns+"/"+cm]
		switch {
		case cm == "":
			t.Errorf("%s: %s=%s is in no ConfigMap volume", who, e.Name, e.Value)
		case !ok:
			t.Errorf("%s mounts ConfigMap %s/%s for %s, which the build does not name (built: %v)", who, ns, cm, e.Name, keys(cms))
		case e.Name == "BUDGET_MAP_PATH" && data[path.Base(e.Value)] == "":
			t.Errorf("%s: ConfigMap %s has no key %s", who, cm, path.Base(e.Value))
		}
		out[e.Name] = cm
	}
	if out["BUDGET_MAP_PATH"] == "" {
		t.Errorf("%s reads no budget map (BUDGET_MAP_PATH)", who)
	}
	return out
}

func keys(m map[string]map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
