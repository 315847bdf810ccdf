package deploy

import (
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

// pod is a pod of the example cluster: where it runs, its labels and its
// named container ports.
type pod struct {
	name, namespace string
	labels          map[string]string
	ports           map[string]int32
}

// namespaceLabels are the labels the API server puts on every namespace.
func namespaceLabels(ns string) map[string]string {
	return map[string]string{"kubernetes.io/metadata.name": ns}
}

func selects(sel *metav1.LabelSelector, set map[string]string) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(set))
}

// peerAdmits is NetworkPolicyPeer semantics (networking/v1): a podSelector
// alone selects pods of the policy's namespace; with a namespaceSelector,
// pods of the selected namespaces (all of them if podSelector is unset).
// ipBlock peers name no pod of the example.
func peerAdmits(p networkingv1.NetworkPolicyPeer, policyNS string, src pod) bool {
	if p.IPBlock != nil {
		return false
	}
	if p.NamespaceSelector == nil {
		return src.namespace == policyNS && selects(p.PodSelector, src.labels)
	}
	if !selects(p.NamespaceSelector, namespaceLabels(src.namespace)) {
		return false
	}
	return p.PodSelector == nil || selects(p.PodSelector, src.labels)
}

// portAdmits matches a rule's port (number or the destination's named
// container port; protocol TCP by default) against a TCP port.
func portAdmits(p networkingv1.NetworkPolicyPort, dst pod, port int32) bool {
	if p.Protocol != nil && *p.Protocol != "TCP" {
		return false
	}
	if p.Port == nil {
		return true
	}
	want := p.Port.IntVal
	if p.Port.StrVal != "" {
		want = dst.ports[p.Port.StrVal]
	}
	if p.EndPort != nil {
		return port >= want && port <= *p.EndPort
	}
	return port == want
}

// ingressAllowed says whether src may open a TCP connection to dst:port.
// A pod no ingress policy selects is not isolated; an isolated pod accepts
// what at least one rule of one selecting policy admits.
func ingressAllowed(policies []networkingv1.NetworkPolicy, src, dst pod, port int32) bool {
	isolated := false
	for _, np := range policies {
		if np.Namespace != dst.namespace || !selects(&np.Spec.PodSelector, dst.labels) {
			continue
		}
		if len(np.Spec.PolicyTypes) > 0 && !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		isolated = true
		for _, r := range np.Spec.Ingress {
			from := len(r.From) == 0 || slices.ContainsFunc(r.From, func(p networkingv1.NetworkPolicyPeer) bool { return peerAdmits(p, np.Namespace, src) })
			ports := len(r.Ports) == 0 || slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return portAdmits(p, dst, port) })
			if from && ports {
				return true
			}
		}
	}
	return !isolated
}

// The pods of the example cluster. Labels as the controllers set them:
// agentgateway's proxy (controller/pkg/helm/agentgateway/templates/_helpers.tpl
// of agentgateway/agentgateway: name/instance/gateway-name = the Gateway,
// gateway-class-name = its GatewayClass), Envoy Gateway's proxy and rate
// limit pods (EG v1.9.1 internal/infrastructure/kubernetes/proxy and
// ratelimit resource.go), the chart's pods.
var (
	agwProxy = pod{"agentgateway proxy", "agents", map[string]string{
		"app.kubernetes.io/name": "agent-gateway", "app.kubernetes.io/instance": "agent-gateway",
		"gateway.networking.k8s.io/gateway-name": "agent-gateway", "gateway.networking.k8s.io/gateway-class-name": "agentgateway",
	}, nil}
	envoyProxy = pod{"Envoy proxy", namespace, map[string]string{
		"app.kubernetes.io/name": "envoy", "app.kubernetes.io/component": "proxy", "app.kubernetes.io/managed-by": "envoy-gateway",
		"gateway.envoyproxy.io/owning-gateway-name": "agent-router", "gateway.envoyproxy.io/owning-gateway-namespace": "ai-gateway",
	}, nil}
	chartPod = pod{"budgetgen-ratelimit", namespace, chartRateLimitLabels, map[string]int32{"grpc": 8081, "http": 8080, "metrics": 19001}}
	egPod    = pod{"envoy-ratelimit", namespace, egRateLimitLabels, map[string]int32{"grpc": 8081, "http": 8080, "metrics": 19001}}
	others   = []pod{
		{"app in agents", "agents", map[string]string{"app": "agent-runner"}, nil},
		{"app in envoy-gateway-system", namespace, map[string]string{"app": "debug"}, nil},
		{"Envoy Gateway controller", namespace, map[string]string{"control-plane": "envoy-gateway", "app.kubernetes.io/name": "gateway-helm"}, nil},
		{"Valkey", namespace, map[string]string{"app.kubernetes.io/name": "valkey"}, nil},
		{"Prometheus", "monitoring", map[string]string{"app.kubernetes.io/name": "prometheus"}, nil},
		{"look-alike agentgateway in default", "default", map[string]string{"app.kubernetes.io/name": "agent-gateway"}, nil},
	}
)

// grpcReach lists "src -> dst" for every pair of the example pods whose
// connection to dst's gRPC port the policies admit.
func grpcReach(policies []networkingv1.NetworkPolicy) []string {
	srcs := append([]pod{agwProxy, envoyProxy, chartPod, egPod}, others...)
	var out []string
	for _, dst := range []pod{chartPod, egPod} {
		for _, src := range srcs {
			if ingressAllowed(policies, src, dst, dst.ports["grpc"]) {
				out = append(out, src.name+" -> "+dst.name)
			}
		}
	}
	return out
}

func networkPolicies(t *testing.T, docs [][]byte) []networkingv1.NetworkPolicy {
	t.Helper()
	var out []networkingv1.NetworkPolicy
	for _, doc := range docs {
		var meta struct{ Kind string }
		if err := sigsyaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Kind != "NetworkPolicy" {
			continue
		}
		var np networkingv1.NetworkPolicy
		strict(t, "NetworkPolicy", doc, &np)
		if np.Namespace == "" {
			np.Namespace = namespace
		}
		out = append(out, np)
	}
	return out
}

func kustomizeDocs(t *testing.T, dir string) [][]byte {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out [][]byte
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, y)
	}
	return out
}

// TestNetworkPoliciesAdmitExactlyTheProxies evaluates the NetworkPolicies of
// the chart (its default values, with config.create=false as the chart
// refuses an empty budget map, and the example's), of deploy/ (Envoy
// Gateway's rate limit pods) and of examples/gitops against the example
// pods: agentgateway's proxy reaches the chart's gRPC port, Envoy's proxy
// reaches Envoy Gateway's rate limit Deployment, and nothing else reaches a
// gRPC port.
func TestNetworkPoliciesAdmitExactlyTheProxies(t *testing.T) {
	deployNPs := networkPolicies(t, kustomizeDocs(t, "."))
	want := []string{"agentgateway proxy -> budgetgen-ratelimit", "Envoy proxy -> envoy-ratelimit"}
	for name, docs := range map[string][][]byte{
		"chart defaults":  splitDocs(t, helmTemplate(t, baseValues)),
		"chart example":   splitDocs(t, helmTemplate(t, exampleValues)),
		"kustomize base":  kustomizeDocs(t, baseDir),
		"examples/gitops": kustomizeDocs(t, "../examples/gitops/deploy"),
	} {
		t.Run(name, func(t *testing.T) {
			nps := append(networkPolicies(t, docs), deployNPs...)
			got := grpcReach(nps)
			if strings.Join(got, "; ") != strings.Join(want, "; ") {
				t.Errorf("gRPC reachable by %v, want exactly %v", got, want)
			}
		})
	}
	// The evaluator itself: without the chart's policy the chart's pods are
	// not isolated and every example pod reaches them.
	if got := grpcReach(deployNPs); len(got) != len(others)+4+1 {
		t.Errorf("without the chart's policy: %d pairs reach gRPC, want %d: %v", len(got), len(others)+5, got)
	}
}

// egressAllowed says whether the policies let src open a TCP connection to
// dst:port. A pod no egress policy selects is not isolated.
func egressAllowed(policies []networkingv1.NetworkPolicy, src, dst pod, port int32) bool {
	isolated := false
	for _, np := range policies {
		if np.Namespace != src.namespace || !selects(&np.Spec.PodSelector, src.labels) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
			continue
		}
		isolated = true
		for _, r := range np.Spec.Egress {
			to := len(r.To) == 0 || slices.ContainsFunc(r.To, func(p networkingv1.NetworkPolicyPeer) bool { return peerAdmits(p, np.Namespace, dst) })
			ports := len(r.Ports) == 0 || slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return portAdmits(p, dst, port) })
			if to && ports {
				return true
			}
		}
	}
	return !isolated
}

// TestChartEgressReachesValkey: the chart's pods may reach Valkey on the
// ports their store uses: the server's port, and with valkey.type sentinel
// the sentinels' too (the service asks them for the primary first), and
// nothing else on the Valkey pods.
func TestChartEgressReachesValkey(t *testing.T) {
	valkey := pod{"Valkey", namespace, map[string]string{"app.kubernetes.io/name": "valkey"}, nil}
	for _, c := range []struct {
		typ   string
		ports map[int32]bool
	}{
		{"single", map[int32]bool{6379: true, 26379: false}},
		{"cluster", map[int32]bool{6379: true, 26379: false}},
		{"sentinel", map[int32]bool{6379: true, 26379: true}},
	} {
		nps := networkPolicies(t, splitDocs(t, runHelm(t, "template", "budgetgen-ratelimit", chartDir, "--namespace", namespace, "--values", exampleValues, "--set", "valkey.type="+c.typ)))
		for port, want := range c.ports {
			if got := egressAllowed(nps, chartPod, valkey, port); got != want {
				t.Errorf("valkey.type %s: the chart's pods reach Valkey's port %d: %v, want %v", c.typ, port, got, want)
			}
		}
	}
}
