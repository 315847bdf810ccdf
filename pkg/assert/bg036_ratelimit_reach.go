package assert

import (
	"encoding/json"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleRateLimitReach: an AgentgatewayPolicy's global rate limit renders
// failureMode FailOpen, so a rate limit Service agentgateway cannot reach
// is a budget that silently counts nothing. The gate shows the path from
// the input: the Service and its port exist, every NetworkPolicy of the
// input selecting the Service's pods admits agentgateway's proxy pods to
// that port, and the TLS the pods serve matches what the backend TLS policy
// on the Service sends. When the input deploys anything in the Service's
// namespace (a Service or Deployment: the rate limit tier is part of it), a
// missing Service fails too: the gate cannot show the budget binds. An
// input of policies alone is not checked for the Service (docs/assert.md).
var ruleRateLimitReach = &Rule{
	ID:       "BG036",
	Name:     "ratelimit-reach",
	Doc:      "the rate limit Service of each AgentgatewayPolicy is in the input with its port, admits agentgateway's proxy pods through the input's NetworkPolicies, and speaks the TLS the backend TLS policy on it sends",
	Severity: Error,
	Check: func(p *Pass) error {
		for _, o := range agentgatewayBudgetPolicies(p.Index) {
			checkReach(p, o)
		}
		return nil
	},
}

const reachRefPath = "spec.traffic.rateLimit.global.backendRef"

// decodeInto decodes an object of the input into a typed API value; a
// object that does not decode is someone else's finding (BG007, BG020).
func decodeInto(o *manifest.Object, into any) bool {
	m, err := o.Decode()
	if err != nil {
		return false
	}
	data, err := json.Marshal(m)
	return err == nil && json.Unmarshal(data, into) == nil
}

// deploysIn reports whether the input holds a Service or Deployment in ns.
func deploysIn(ix *Index, ns string) bool {
	for _, o := range ix.Objects {
		if o.Namespace == ns && ((o.Kind == "Service" && o.Group() == "") || (o.Kind == "Deployment" && o.Group() == "apps")) {
			return true
		}
	}
	return false
}

func findObject(ix *Index, kind, ns, name string) *manifest.Object {
	for _, o := range ix.Objects {
		if o.Kind == kind && o.Group() == "" && o.Namespace == ns && o.Name == name {
			return o
		}
	}
	return nil
}

func checkReach(p *Pass, o *manifest.Object) {
	var pol agentgateway.Policy
	if !decodeInto(o, &pol) || pol.Spec.Traffic == nil || pol.Spec.Traffic.RateLimit == nil || pol.Spec.Traffic.RateLimit.Global == nil {
		return
	}
	ref := pol.Spec.Traffic.RateLimit.Global.BackendRef
	if ref == nil || (ref.Kind != "" && ref.Kind != "Service") || (ref.Group != nil && *ref.Group != "") || ref.Port == nil {
		return // a url or an AgentgatewayBackend: nothing the gate can follow
	}
	node := NodeAt(o.Node, reachRefPath)
	ns := ref.Namespace
	if ns == "" {
		ns = o.Namespace
	}
	svcObj := findObject(p.Index, "Service", ns, ref.Name)
	if svcObj == nil && deploysIn(p.Index, ns) {
		p.Report(o, node, reachRefPath, "rate limit Service %s/%s is not in the input: the gate cannot show agentgateway reaches it (with failureMode FailOpen an unreachable service counts nothing); add its manifests (kustomize build, helm template) to the input or --skip BG036", ns, ref.Name)
		return
	}
	if svcObj == nil {
		return // the input holds only policies: the rate limit tier is deployed elsewhere
	}
	var svc corev1.Service
	if !decodeInto(svcObj, &svc) {
		return
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == *ref.Port {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		p.Report(o, node, reachRefPath+".port", "rate limit Service %s/%s has no port %d (%s)", ns, ref.Name, *ref.Port, svcObj.File)
		return
	}
	pods := backingPods(p.Index, ns, svc.Spec.Selector)
	for _, np := range reachPolicies(p.Index, ns) {
		checkAdmits(p, o, node, np, pods, *sp, proxyPod(p.Index, o, &pol))
	}
	checkTLS(p, o, node, ns, ref.Name, pods)
}

// backingPod is the pod template of a Deployment the Service selects.
type backingPod struct {
	owner  string
	labels map[string]string
	ports  map[string]int32
	env    map[string]string
}

func backingPods(ix *Index, ns string, selector map[string]string) []backingPod {
	if len(selector) == 0 {
		return nil
	}
	var out []backingPod
	for _, o := range ix.Objects {
		if o.Kind != "Deployment" || o.Namespace != ns {
			continue
		}
		var d appsv1.Deployment
		if !decodeInto(o, &d) || !labels.SelectorFromSet(selector).Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		bp := backingPod{owner: o.String(), labels: d.Spec.Template.Labels, ports: map[string]int32{}, env: map[string]string{}}
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name != "" {
					bp.ports[cp.Name] = cp.ContainerPort
				}
			}
			for _, e := range c.Env {
				bp.env[e.Name] = e.Value
			}
		}
		out = append(out, bp)
	}
	return out
}

type reachPolicy struct {
	obj *manifest.Object
	np  networkingv1.NetworkPolicy
}

func reachPolicies(ix *Index, ns string) []reachPolicy {
	var out []reachPolicy
	for _, o := range ix.Objects {
		if o.Kind != "NetworkPolicy" || o.Group() != "networking.k8s.io" {
			continue
		}
		var np networkingv1.NetworkPolicy
		if !decodeInto(o, &np) {
			continue
		}
		if np.Namespace == "" {
			np.Namespace = o.Namespace
		}
		if np.Namespace == ns {
			out = append(out, reachPolicy{obj: o, np: np})
		}
	}
	return out
}

// proxyPod is agentgateway's proxy pod for the policy's Gateway, labelled as
// agentgateway's controller labels it (controller/pkg/helm/agentgateway/
// templates/_helpers.tpl of agentgateway/agentgateway): the Gateway's name
// and its GatewayClass (from the input, "agentgateway" when absent).
func proxyPod(ix *Index, o *manifest.Object, pol *agentgateway.Policy) netPod {
	gw, class := "", "agentgateway"
	for _, r := range pol.Spec.TargetRefs {
		if r.Kind == "Gateway" {
			gw = r.Name
		}
	}
	for _, g := range ix.Objects {
		if g.Kind == "Gateway" && g.Group() == GroupGateway && g.Namespace == o.Namespace && g.Name == gw {
			if c := manifest.Str(manifest.Get(g.Node, "spec", "gatewayClassName")); c != "" {
				class = c
			}
		}
	}
	return netPod{namespace: o.Namespace, labels: map[string]string{
		"app.kubernetes.io/name": gw, "app.kubernetes.io/instance": gw,
		"gateway.networking.k8s.io/gateway-name": gw, "gateway.networking.k8s.io/gateway-class-name": class,
	}}
}

// checkAdmits reports a NetworkPolicy that isolates the Service's pods for
// ingress and admits no agentgateway proxy pod to the Service's target port.
func checkAdmits(p *Pass, o *manifest.Object, node *yamlNode, rp reachPolicy, pods []backingPod, sp corev1.ServicePort, src netPod) {
	for _, bp := range pods {
		if !selectsPod(&rp.np, bp.labels) {
			continue
		}
		port := sp.TargetPort.IntVal
		if sp.TargetPort.StrVal != "" {
			port = bp.ports[sp.TargetPort.StrVal]
		} else if port == 0 {
			port = sp.Port
		}
		if !admits(&rp.np, src, bp.ports, port) {
			p.Report(o, node, reachRefPath, "NetworkPolicy %s/%s (%s) selects the rate limit pods of %s and admits no agentgateway proxy pod of Gateway %s/%s to port %d: every rate limit call is dropped",
				rp.np.Namespace, rp.np.Name, rp.obj.File, bp.owner, src.namespace, src.labels["gateway.networking.k8s.io/gateway-name"], port)
			return
		}
	}
}

// checkTLS compares the TLS the Service's pods serve (the service's
// GRPC_SERVER_USE_TLS and client CA settings) with the backend TLS policy
// the input attaches to the Service.
func checkTLS(p *Pass, o *manifest.Object, node *yamlNode, ns, svc string, pods []backingPod) {
	clientTLS, clientCert := false, false
	for _, t := range p.Index.Objects {
		var bp agentgateway.Policy
		if t.Kind != agentgateway.KindPolicy || t.Group() != agentgateway.Group || t.Namespace != ns || !decodeInto(t, &bp) ||
			bp.Spec.Backend == nil || bp.Spec.Backend.TLS == nil {
			continue
		}
		for _, r := range bp.Spec.TargetRefs {
			if r.Kind == "Service" && r.Group == "" && r.Name == svc {
				clientTLS = true
				clientCert = clientCert || len(bp.Spec.Backend.TLS.MtlsCertificateRef) > 0
				checkTLSName(p, o, node, t, ns, svc)
			}
		}
	}
	for _, bp := range pods {
		serverTLS := strings.EqualFold(bp.env["GRPC_SERVER_USE_TLS"], "true")
		mutual := serverTLS && (bp.env["GRPC_SERVER_TLS_CA_CERT"] != "" || bp.env["GRPC_CLIENT_TLS_CACERT"] != "")
		var msg string
		switch {
		case mutual && !clientCert:
			msg = "require client certificates (GRPC_SERVER_TLS_CA_CERT) and no backend TLS policy on Service %s/%s sends one (spec.backend.tls.mtlsCertificateRef): every call fails the handshake"
		case serverTLS && !clientTLS:
			msg = "serve gRPC over TLS and no backend TLS policy on Service %s/%s makes agentgateway speak TLS: every call fails"
		case !serverTLS && clientTLS:
			msg = "serve plaintext gRPC and a backend TLS policy on Service %s/%s makes agentgateway speak TLS: every call fails"
		default:
			continue
		}
		p.Report(o, node, reachRefPath, "rate limit pods of "+bp.owner+" "+msg, ns, svc)
	}
}

// checkTLSName reports a backend TLS policy (t) on the rate limit Service
// that names no server: agentgateway connects to a Service's endpoints by
// address (build_service_call in crates/agentgateway/src/proxy/httpproxy.rs,
// Target::Address of the workload IP) and, without sni, sends and verifies
// that IP (handshake in crates/agentgateway/src/client/tls.rs), which a
// certificate for the Service's DNS names does not carry.
// verifySubjectAltNames (checked instead of the name), insecureSkipVerify
// (no name check) and certificateSource (SPIFFE: any SVID of the trust
// bundle, LocalSpiffeBackendTLS in crates/agentgateway/src/http/backendtls.rs)
// also avoid it.
func checkTLSName(p *Pass, o *manifest.Object, node *yamlNode, t *manifest.Object, ns, svc string) {
	tls := manifest.Get(t.Node, "spec", "backend", "tls")
	for _, f := range []string{"sni", "verifySubjectAltNames", "insecureSkipVerify", "certificateSource"} {
		if manifest.Get(tls, f) != nil {
			return
		}
	}
	p.Report(o, node, reachRefPath, "the backend TLS policy %s on rate limit Service %s/%s sets no sni: agentgateway connects to the Service's pods by address and, without sni, verifies the pod's IP as the server name (build_service_call in crates/agentgateway/src/proxy/httpproxy.rs, handshake in crates/agentgateway/src/client/tls.rs), which the service's certificate for %s.%s.svc.cluster.local does not carry: every call fails and FailOpen admits every request uncounted; set spec.backend.tls.sni: %s.%s.svc.cluster.local (budgetgen render writes it)",
		t, ns, svc, svc, ns, svc, ns)
}
