package deploy

import (
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

// TestChartServiceMonitorScrapesTheMetricsPort: the ServiceMonitor scrapes
// the Service's port named metrics, which targets the container's port of
// that name, on the path the service serves them (PROMETHEUS_PATH when
// env sets it, /metrics otherwise).
func TestChartServiceMonitorScrapesTheMetricsPort(t *testing.T) {
	for _, c := range []struct {
		set  []string
		path string
	}{
		{nil, "/metrics"},
		{[]string{"env.PROMETHEUS_PATH=/prom"}, "/prom"},
	} {
		args := []string{"template", "budgetgen-ratelimit", chartDir, "--namespace", namespace, "--values", exampleValues}
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		var smPort, smPath, svcTarget, containerPort string
		for _, doc := range splitDocs(t, runHelm(t, args...)) {
			var o struct {
				Kind string `json:"kind"`
				Spec struct {
					Endpoints []struct{ Port, Path string } `json:"endpoints"`
					Ports     []struct {
						Name       string `json:"name"`
						TargetPort any    `json:"targetPort"`
					} `json:"ports"`
					Template struct {
						Spec struct {
							Containers []struct {
								Ports []struct{ Name string } `json:"ports"`
							} `json:"containers"`
						} `json:"spec"`
					} `json:"template"`
				} `json:"spec"`
			}
			if err := sigsyaml.Unmarshal(doc, &o); err != nil {
				t.Fatal(err)
			}
			switch o.Kind {
			case "ServiceMonitor":
				smPort, smPath = o.Spec.Endpoints[0].Port, o.Spec.Endpoints[0].Path
			case "Service":
				for _, p := range o.Spec.Ports {
					if p.Name == smPort || (smPort == "" && p.Name == "metrics") {
						svcTarget, _ = p.TargetPort.(string)
					}
				}
			case "Deployment":
				for _, p := range o.Spec.Template.Spec.Containers[0].Ports {
					if p.Name == "metrics" {
						containerPort = p.Name
					}
				}
			}
		}
		if smPort != "metrics" || svcTarget != "metrics" || containerPort != "metrics" || smPath != c.path {
			t.Errorf("%v: ServiceMonitor port %q path %q, Service targetPort %q, container port %q; want metrics everywhere and path %s",
				c.set, smPort, smPath, svcTarget, containerPort, c.path)
		}
	}
}
