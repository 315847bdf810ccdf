// Package deploy holds the kustomize manifests for running budgetgen's rate
// limit service under Envoy Gateway; its tests render and validate them and
// check the Dockerfiles at the repository root against the source tree.
package deploy

import (
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	egvalidation "github.com/envoyproxy/gateway/api/v1alpha1/validation"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Labels Envoy Gateway v1.9.1 puts on the rate limit pods
// (internal/infrastructure/kubernetes/ratelimit/resource.go rateLimitLabels);
// internal to EG's module, so restated here.
var egRateLimitLabels = map[string]string{
	"app.kubernetes.io/name":      "envoy-ratelimit",
	"app.kubernetes.io/component": "ratelimit",
}

// Labels the budgetgen-ratelimit chart puts on its pods (selector labels
// with the default release name).
var chartRateLimitLabels = map[string]string{
	"app.kubernetes.io/name":      "budgetgen-ratelimit",
	"app.kubernetes.io/instance":  "budgetgen-ratelimit",
	"app.kubernetes.io/component": "ratelimit",
}

const namespace = "envoy-gateway-system"

// render builds the kustomization in this directory and returns each object's
// YAML by kind/name.
func render(t *testing.T) map[string][]byte {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), ".")
	if err != nil {
		t.Fatalf("kustomize build deploy/: %v", err)
	}
	out := map[string][]byte{}
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		id := r.GetKind() + "/" + r.GetName()
		if _, dup := out[id]; dup {
			t.Errorf("%s rendered twice", id)
		}
		if ns := r.GetNamespace(); ns != namespace {
			t.Errorf("%s: namespace %q, want %q", id, ns, namespace)
		}
		out[id] = y
	}
	return out
}

func strict(t *testing.T, id string, data []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%s is not a well-formed object: %v", id, err)
	}
}

func TestKustomizeRendersValkeyWithPersistence(t *testing.T) {
	objs := render(t)
	want := []string{"ConfigMap/valkey-config", "StatefulSet/valkey", "Service/valkey", "NetworkPolicy/valkey", "ConfigMap/envoy-gateway-config", "NetworkPolicy/envoy-ratelimit"}
	if len(objs) != len(want) {
		t.Errorf("rendered %d objects, want %d", len(objs), len(want))
	}
	for _, id := range want {
		if objs[id] == nil {
			t.Fatalf("missing %s", id)
		}
	}

	var sts appsv1.StatefulSet
	strict(t, "StatefulSet/valkey", objs["StatefulSet/valkey"], &sts)
	var svc corev1.Service
	strict(t, "Service/valkey", objs["Service/valkey"], &svc)
	var cm corev1.ConfigMap
	strict(t, "ConfigMap/valkey-config", objs["ConfigMap/valkey-config"], &cm)
	var np networkingv1.NetworkPolicy
	strict(t, "NetworkPolicy/valkey", objs["NetworkPolicy/valkey"], &np)

	// Persistence: append-only file on a claimed volume mounted at the dir.
	conf := cm.Data["valkey.conf"]
	for _, line := range []string{"appendonly yes", "dir /data", "maxmemory-policy noeviction"} {
		if !hasLine(conf, line) {
			t.Errorf("valkey.conf lacks %q", line)
		}
	}
	if len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.VolumeClaimTemplates[0].Name != "data" {
		t.Fatalf("StatefulSet has no data volume claim")
	}
	c := sts.Spec.Template.Spec.Containers[0]
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if mounts["data"] != "/data" || mounts["config"] != "/etc/valkey" {
		t.Errorf("mounts = %v", mounts)
	}
	if len(c.Args) != 2 || c.Args[1] != "/etc/valkey/valkey.conf" {
		t.Errorf("valkey args = %v: the config file is not used", c.Args)
	}
	var cmVol bool
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Name == "config" && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			cmVol = true
		}
	}
	if !cmVol {
		t.Error("the config volume does not mount ConfigMap valkey-config")
	}
	if sts.Spec.ServiceName != svc.Name {
		t.Errorf("serviceName %q != Service %q", sts.Spec.ServiceName, svc.Name)
	}
	// The Service and the NetworkPolicy select the Valkey pods; the policy
	// admits EG's rate limit pods.
	podLabels := sts.Spec.Template.Labels
	if !subset(svc.Spec.Selector, podLabels) || !subset(sts.Spec.Selector.MatchLabels, podLabels) || !subset(np.Spec.PodSelector.MatchLabels, podLabels) {
		t.Errorf("selectors do not match the pod labels %v", podLabels)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 2 || !subset(np.Spec.Ingress[0].From[0].PodSelector.MatchLabels, egRateLimitLabels) ||
		!subset(np.Spec.Ingress[0].From[1].PodSelector.MatchLabels, chartRateLimitLabels) {
		t.Errorf("NetworkPolicy does not admit Envoy Gateway's and the chart's rate limit pods")
	}
	if sc := sts.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("Valkey runs as root")
	}
}

func hasLine(conf, line string) bool {
	for _, l := range strings.Split(conf, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// loadEnvoyGateway decodes an EnvoyGateway config strictly with EG's types,
// applies EG's defaults and runs EG's own validation, as EG does at start.
func loadEnvoyGateway(t *testing.T, where string, data []byte) *egv1a1.EnvoyGateway {
	t.Helper()
	eg := &egv1a1.EnvoyGateway{}
	if err := yaml.UnmarshalStrict(data, eg); err != nil {
		t.Fatalf("%s: not a valid EnvoyGateway: %v", where, err)
	}
	if eg.APIVersion != egv1a1.GroupVersion.String() || eg.Kind != egv1a1.KindEnvoyGateway {
		t.Fatalf("%s: apiVersion/kind = %s/%s", where, eg.APIVersion, eg.Kind)
	}
	eg.SetEnvoyGatewayDefaults()
	if err := egvalidation.ValidateEnvoyGateway(eg); err != nil {
		t.Fatalf("%s: Envoy Gateway rejects the config: %v", where, err)
	}
	return eg
}

func TestEnvoyGatewayConfig(t *testing.T) {
	objs := render(t)
	var cm corev1.ConfigMap
	strict(t, "ConfigMap/envoy-gateway-config", objs["ConfigMap/envoy-gateway-config"], &cm)
	raw, ok := cm.Data["envoy-gateway.yaml"]
	if !ok {
		t.Fatal("envoy-gateway-config has no envoy-gateway.yaml (the key EG reads)")
	}
	eg := loadEnvoyGateway(t, "envoy-gateway-config", []byte(raw))
	checkRateLimit(t, eg, objs)
	if eg.Provider.Type != egv1a1.ProviderTypeKubernetes {
		t.Errorf("provider = %s", eg.Provider.Type)
	}
	dep := eg.Provider.Kubernetes.RateLimitDeployment
	if dep == nil || dep.Container == nil || dep.Container.Image == nil || !strings.HasPrefix(*dep.Container.Image, "ghcr.io/budgetgen/ratelimit:") {
		t.Fatalf("rateLimitDeployment does not use our image: %+v", dep)
	}

	// The Helm values carry the same settings.
	hv, err := os.ReadFile("envoy-gateway/helm-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Global struct {
			Images struct {
				Ratelimit struct {
					Image      string `json:"image"`
					PullPolicy string `json:"pullPolicy"`
				} `json:"ratelimit"`
			} `json:"images"`
		} `json:"global"`
		Config struct {
			EnvoyGateway map[string]any `json:"envoyGateway"`
		} `json:"config"`
	}
	if err := yaml.UnmarshalStrict(hv, &values); err != nil {
		t.Fatalf("helm-values.yaml: %v", err)
	}
	if values.Global.Images.Ratelimit.Image != *dep.Container.Image {
		t.Errorf("helm image %q != ConfigMap image %q", values.Global.Images.Ratelimit.Image, *dep.Container.Image)
	}
	// The chart merges config.envoyGateway into its own defaults (gateway,
	// logging, the rate limit image); do the same, then validate.
	merged := values.Config.EnvoyGateway
	merged["apiVersion"] = egv1a1.GroupVersion.String()
	merged["kind"] = egv1a1.KindEnvoyGateway
	merged["gateway"] = map[string]any{"controllerName": egv1a1.GatewayControllerName}
	data, err := yaml.Marshal(merged)
	if err != nil {
		t.Fatal(err)
	}
	heg := loadEnvoyGateway(t, "helm-values.yaml config.envoyGateway", data)
	checkRateLimit(t, heg, objs)
}

// checkRateLimit: global rate limiting on, Redis backend, URL naming the
// Valkey Service of this kustomization, fail-open with a timeout under EG's.
func checkRateLimit(t *testing.T, eg *egv1a1.EnvoyGateway, objs map[string][]byte) {
	t.Helper()
	rl := eg.RateLimit
	if rl == nil || rl.Backend.Type != egv1a1.RedisBackendType || rl.Backend.Redis == nil || rl.Backend.Redis.URL == nil {
		t.Fatalf("rateLimit backend is not Redis with a URL: %+v", rl)
	}
	var svc corev1.Service
	strict(t, "Service/valkey", objs["Service/valkey"], &svc)
	host, port, err := net.SplitHostPort(*rl.Backend.Redis.URL)
	if err != nil {
		t.Fatalf("redis url %q: %v", *rl.Backend.Redis.URL, err)
	}
	wantHost := fmt.Sprintf("%s.%s.svc.cluster.local", svc.Name, namespace)
	if host != wantHost || port != fmt.Sprint(svc.Spec.Ports[0].Port) {
		t.Errorf("redis url %q does not name the Valkey Service (%s:%d)", *rl.Backend.Redis.URL, wantHost, svc.Spec.Ports[0].Port)
	}
	if rl.FailClosed {
		t.Error("failClosed: a Valkey outage would stop all LLM traffic")
	}
}

// TestDockerfiles checks, by reading them, that the Dockerfiles build what
// exists: every COPY source exists and is not excluded by .dockerignore, every
// package the binary needs (and its embedded files) is inside what is copied,
// -X flags name existing variables, the binary lands where the ENTRYPOINT (and,
// for ratelimit, Envoy Gateway's command /bin/ratelimit) expects it, it is
// static (CGO_ENABLED=0) and runs as a non-root user.
func TestDockerfiles(t *testing.T) {
	for _, c := range []struct{ file, pkg, binary string }{
		{"Dockerfile.ratelimit", "./cmd/ratelimit", "/bin/ratelimit"},
		{"Dockerfile.budgetgen", "./cmd/budgetgen", "/bin/budgetgen"},
	} {
		t.Run(c.file, func(t *testing.T) {
			df := parseDockerfile(t, filepath.Join("..", c.file))
			checkDockerfile(t, df, c.pkg, c.binary)
		})
	}
}

// TestRateLimitNetworkPolicy: the rate limit pods (EG's labels) admit gRPC
// only from Envoy proxy pods, the health port from anywhere (kubelet),
// metrics only from the Prometheus namespace, and nothing on the debug port;
// they may reach only Valkey (the pods of this kustomization), EG's xDS and
// DNS.
func TestRateLimitNetworkPolicy(t *testing.T) {
	objs := render(t)
	var np networkingv1.NetworkPolicy
	strict(t, "NetworkPolicy/envoy-ratelimit", objs["NetworkPolicy/envoy-ratelimit"], &np)
	var sts appsv1.StatefulSet
	strict(t, "StatefulSet/valkey", objs["StatefulSet/valkey"], &sts)
	if np.Namespace != "envoy-gateway-system" || !subset(np.Spec.PodSelector.MatchLabels, egRateLimitLabels) || len(np.Spec.PodSelector.MatchLabels) != len(egRateLimitLabels) {
		t.Fatalf("policy does not select EG's rate limit pods: %s %v", np.Namespace, np.Spec.PodSelector.MatchLabels)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("policy types %v: both directions must be restricted", np.Spec.PolicyTypes)
	}
	proxy := map[string]string{"app.kubernetes.io/name": "envoy", "app.kubernetes.io/component": "proxy", "app.kubernetes.io/managed-by": "envoy-gateway"}
	ingress := map[int32]networkingv1.NetworkPolicyIngressRule{}
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) != 1 || r.Ports[0].Port == nil {
			t.Fatalf("ingress rule with other than one port: %+v", r)
		}
		ingress[r.Ports[0].Port.IntVal] = r
	}
	if len(ingress) != 3 {
		t.Errorf("ingress ports %v, want exactly 8081, 8080 and 19001 (never the debug port 6070)", slices.Collect(maps.Keys(ingress)))
	}
	if r := ingress[8081]; len(r.From) != 1 || r.From[0].NamespaceSelector == nil || !maps.Equal(r.From[0].PodSelector.MatchLabels, proxy) {
		t.Errorf("gRPC 8081 is not limited to Envoy proxy pods: %+v", r.From)
	}
	if r, ok := ingress[8080]; !ok || len(r.From) != 0 {
		t.Errorf("health port 8080 must be open to the kubelet: %+v", r)
	}
	if r := ingress[19001]; len(r.From) != 1 || r.From[0].PodSelector != nil || r.From[0].NamespaceSelector == nil || r.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "" {
		t.Errorf("metrics 19001 is not limited to one namespace: %+v", r.From)
	}
	egress := map[int32][]networkingv1.NetworkPolicyPeer{}
	for _, r := range np.Spec.Egress {
		for _, p := range r.Ports {
			egress[p.Port.IntVal] = r.To
		}
	}
	if to := egress[6379]; len(to) != 1 || !subset(to[0].PodSelector.MatchLabels, sts.Spec.Template.Labels) {
		t.Errorf("egress to Valkey does not select the Valkey pods: %+v", to)
	}
	if to := egress[18001]; len(to) != 1 || to[0].PodSelector.MatchLabels["control-plane"] != "envoy-gateway" {
		t.Errorf("egress to EG's xDS: %+v", to)
	}
	if to := egress[53]; len(to) != 1 || to[0].PodSelector.MatchLabels["k8s-app"] != "kube-dns" {
		t.Errorf("egress to DNS: %+v", to)
	}
	if len(egress) != 3 {
		t.Errorf("egress ports %v, want only 6379, 18001 and 53", slices.Collect(maps.Keys(egress)))
	}
}

// TestReadmeCreatesTheMountedConfigMaps: every ConfigMap the rate limit
// pods mount that deploy/ does not create (the budget map: it comes from the
// team's spec) is created by the README's Envoy Gateway steps before the step
// that makes Envoy Gateway start the pods, under the file name the service
// reads. Kubernetes does not start a pod whose ConfigMap volume is missing.
func TestReadmeCreatesTheMountedConfigMaps(t *testing.T) {
	objs := render(t)
	var cm corev1.ConfigMap
	strict(t, "ConfigMap/envoy-gateway-config", objs["ConfigMap/envoy-gateway-config"], &cm)
	eg := loadEnvoyGateway(t, "envoy-gateway-config", []byte(cm.Data["envoy-gateway.yaml"]))
	dep := eg.Provider.Kubernetes.RateLimitDeployment
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	start := strings.Index(section, "\n## Use with Envoy Gateway\n")
	if start < 0 {
		t.Fatal(`README.md has no "## Use with Envoy Gateway" section`)
	}
	section = section[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	upgrade := strings.Index(section, "helm upgrade eg ")
	if upgrade < 0 {
		t.Fatal("the Envoy Gateway section no longer runs helm upgrade eg")
	}
	files := map[string]bool{}
	for _, e := range dep.Container.Env {
		files[filepath.Base(e.Value)] = true
	}
	n := 0
	for _, v := range dep.Pod.Volumes {
		if v.ConfigMap == nil || objs["ConfigMap/"+v.ConfigMap.Name] != nil {
			continue
		}
		n++
		create := "kubectl -n " + namespace + " create configmap " + v.ConfigMap.Name + " --from-file="
		at := strings.Index(section, create)
		if at < 0 || at > upgrade {
			t.Errorf("the rate limit pods mount ConfigMap %s, which deploy/ does not create and the README's steps do not create (%q) before helm upgrade", v.ConfigMap.Name, create)
			continue
		}
		file := strings.Fields(section[at+len(create):])[0]
		if !files[filepath.Base(file)] {
			t.Errorf("the README creates %s from %s, but the service reads %v", v.ConfigMap.Name, file, slices.Sorted(maps.Keys(files)))
		}
	}
	if n == 0 {
		t.Fatal("no ConfigMap volume outside deploy/: the test no longer checks anything")
	}
}
