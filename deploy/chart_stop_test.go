package deploy

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/budgetgen/budgetgen/internal/ratelimit/settings"
)

// stopAfterDelay bounds the service's stop once SHUTDOWN_DELAY is over:
// the gRPC drain (5 s, internal/ratelimit/service shutdownDrain), the HTTP
// servers' shutdown (1 s), then the components in turn: the engine's last
// flush, threshold events (3 s), the ledger's last flush (5 s) and Valkey's
// close (in-flight calls about 2.5 s, last replay 1 s). The chart's
// rls.validate uses the same 20 s.
const stopAfterDelay = 20 * time.Second

// podShutdownDelay is SHUTDOWN_DELAY as the service resolves it from the
// container's literal environment plus what the kubelet adds to every
// container (KUBERNETES_SERVICE_HOST).
func podShutdownDelay(t *testing.T, env map[string]string) time.Duration {
	t.Helper()
	env["KUBERNETES_SERVICE_HOST"] = "10.96.0.1"
	s, err := settings.Load(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatalf("the pod's settings do not load: %v", err)
	}
	return s.ShutdownDelay
}

// TestChartGracePeriodCoversTheStop: the chart's pod keeps serving for
// SHUTDOWN_DELAY after SIGTERM, and its terminationGracePeriodSeconds
// covers that delay plus the stop after it (with the defaults and with a
// longer delay); a grace period too short for the delay is refused at
// install, and env cannot set SHUTDOWN_DELAY behind the chart's back.
func TestChartGracePeriodCoversTheStop(t *testing.T) {
	for _, set := range [][]string{nil, {"shutdownDelaySeconds=30", "terminationGracePeriodSeconds=60"}} {
		dep, _ := chartObjects(t, set...)
		env := map[string]string{}
		for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
			if e.ValueFrom == nil {
				env[e.Name] = e.Value
			}
		}
		delay := podShutdownDelay(t, env)
		if set == nil && delay != settings.DefaultKubernetesShutdownDelay {
			t.Errorf("default values: SHUTDOWN_DELAY resolves to %v, want %v", delay, settings.DefaultKubernetesShutdownDelay)
		}
		if delay <= 0 {
			t.Errorf("--set %v: no shutdown delay in the chart's pod (SHUTDOWN_DELAY=%q)", set, env["SHUTDOWN_DELAY"])
		}
		g := dep.Spec.Template.Spec.TerminationGracePeriodSeconds
		if g == nil {
			t.Fatalf("--set %v: no terminationGracePeriodSeconds (Kubernetes' 30 s default)", set)
		}
		if grace := time.Duration(*g) * time.Second; grace < delay+stopAfterDelay {
			t.Errorf("--set %v: terminationGracePeriodSeconds %v < SHUTDOWN_DELAY %v + stop %v", set, grace, delay, stopAfterDelay)
		}
	}
	helmRefuses(t, "terminationGracePeriodSeconds (40) must be at least shutdownDelaySeconds (30) + 20", "--values", exampleValues, "--set", "shutdownDelaySeconds=30")
	helmRefuses(t, "invalid propertyName 'SHUTDOWN_DELAY'", "--values", exampleValues, "--set", "env.SHUTDOWN_DELAY=5m")
	helmRefuses(t, "shutdownDelaySeconds", "--values", exampleValues, "--set", "shutdownDelaySeconds=121", "--set", "terminationGracePeriodSeconds=200")
}

// TestEnvoyGatewayGracePeriodCoversTheStop: Envoy Gateway's own rate limit
// Deployment runs our image with SHUTDOWN_DELAY unset (auto: the pod
// default, KUBERNETES_SERVICE_HOST being set there as in every pod) and
// its own terminationGracePeriodSeconds, read from the Deployment EG's
// tests render (internal/infrastructure/kubernetes/ratelimit/testdata/
// deployments/default.yaml of github.com/envoyproxy/gateway v1.9.1, the
// output of resource_provider.go): it must cover the delay and the stop.
func TestEnvoyGatewayGracePeriodCoversTheStop(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/envoyproxy/gateway").Output()
	if err != nil {
		t.Fatalf("locate the Envoy Gateway module: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "internal", "infrastructure", "kubernetes", "ratelimit", "testdata", "deployments", "default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	if err := sigsyaml.Unmarshal(b, &dep); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	// Our helm-values.yaml adds only BUDGET_MAP_PATH to EG's container.
	delay := podShutdownDelay(t, map[string]string{"SHUTDOWN_DELAY": env["SHUTDOWN_DELAY"]})
	if delay != settings.DefaultKubernetesShutdownDelay {
		t.Errorf("in Envoy Gateway's pod SHUTDOWN_DELAY resolves to %v, want the pod default %v", delay, settings.DefaultKubernetesShutdownDelay)
	}
	g := dep.Spec.Template.Spec.TerminationGracePeriodSeconds
	if g == nil {
		t.Fatal("Envoy Gateway's rate limit Deployment sets no terminationGracePeriodSeconds")
	}
	if grace := time.Duration(*g) * time.Second; grace < delay+stopAfterDelay {
		t.Errorf("Envoy Gateway's terminationGracePeriodSeconds %v < SHUTDOWN_DELAY %v + stop %v", grace, delay, stopAfterDelay)
	}
	t.Logf("Envoy Gateway's rate limit pod: grace %ds, delay %v, stop <= %v", *g, delay, stopAfterDelay)
}

// TestChartKeepsTheSharedBudgetMap: Envoy Gateway's rate limit Deployment
// mounts the budget map ConfigMap the chart creates, so helm uninstall must
// leave it (helm.sh/resource-policy: keep, the annotation Helm's uninstall
// and upgrade read: pkg/action/resource_policy.go of helm.sh/helm/v3), while
// the chart's own config ConfigMap, mounted by nobody else, goes with the
// release.
func TestChartKeepsTheSharedBudgetMap(t *testing.T) {
	policies := map[string]string{}
	for _, doc := range splitDocs(t, helmTemplate(t, exampleValues)) {
		var m struct {
			Kind     string
			Metadata struct {
				Name        string
				Annotations map[string]string
			}
		}
		if err := sigsyaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		if m.Kind == "ConfigMap" {
			policies[m.Metadata.Name] = m.Metadata.Annotations["helm.sh/resource-policy"]
		}
	}
	egMounts := egBudgetMapName(t)
	if got, ok := policies[egMounts]; !ok || got != "keep" {
		t.Errorf("ConfigMap %s (mounted by Envoy Gateway's rate limit Deployment): helm.sh/resource-policy = %q, want keep (rendered ConfigMaps: %v)", egMounts, got, policies)
	}
	if got := policies["budgetgen-ratelimit-config"]; got != "" {
		t.Errorf("ConfigMap budgetgen-ratelimit-config: helm.sh/resource-policy = %q, want none (only the chart's pods mount it)", got)
	}
}

// egBudgetMapName is the ConfigMap deploy/envoy-gateway/helm-values.yaml
// has Envoy Gateway's rate limit pods mount as the budget map.
func egBudgetMapName(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("envoy-gateway/helm-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Config struct {
			EnvoyGateway struct {
				Provider struct {
					Kubernetes struct {
						RateLimitDeployment struct {
							Pod struct {
								Volumes []struct {
									Name      string
									ConfigMap *struct{ Name string } `json:"configMap"`
								}
							}
						} `json:"rateLimitDeployment"`
					}
				}
			} `json:"envoyGateway"`
		}
	}
	if err := sigsyaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	for _, vol := range v.Config.EnvoyGateway.Provider.Kubernetes.RateLimitDeployment.Pod.Volumes {
		if vol.Name == "budget-map" && vol.ConfigMap != nil {
			return vol.ConfigMap.Name
		}
	}
	t.Fatal("deploy/envoy-gateway/helm-values.yaml mounts no budget-map ConfigMap")
	return ""
}
