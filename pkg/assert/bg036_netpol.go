package assert

import (
	"slices"

	"gopkg.in/yaml.v3"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

type yamlNode = yaml.Node

// netPod is a connection's source: its namespace and labels.
type netPod struct {
	namespace string
	labels    map[string]string
}

func matches(sel *metav1.LabelSelector, set map[string]string) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(set))
}

// selectsPod: np isolates pods with these labels for ingress.
func selectsPod(np *networkingv1.NetworkPolicy, podLabels map[string]string) bool {
	if len(np.Spec.PolicyTypes) > 0 && !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		return false
	}
	return matches(&np.Spec.PodSelector, podLabels)
}

// admits is one policy's ingress rules (networking/v1): some rule whose
// peers include src (a podSelector alone: the policy's namespace; with a
// namespaceSelector: the namespaces it selects, by their
// kubernetes.io/metadata.name label) and whose ports include the TCP port.
func admits(np *networkingv1.NetworkPolicy, src netPod, named map[string]int32, port int32) bool {
	peer := func(pe networkingv1.NetworkPolicyPeer) bool {
		if pe.IPBlock != nil {
			return false
		}
		if pe.NamespaceSelector == nil {
			return src.namespace == np.Namespace && matches(pe.PodSelector, src.labels)
		}
		return matches(pe.NamespaceSelector, map[string]string{"kubernetes.io/metadata.name": src.namespace}) &&
			(pe.PodSelector == nil || matches(pe.PodSelector, src.labels))
	}
	portOK := func(pp networkingv1.NetworkPolicyPort) bool {
		if pp.Protocol != nil && *pp.Protocol != "TCP" {
			return false
		}
		if pp.Port == nil {
			return true
		}
		want := pp.Port.IntVal
		if pp.Port.StrVal != "" {
			want = named[pp.Port.StrVal]
		}
		if pp.EndPort != nil {
			return port >= want && port <= *pp.EndPort
		}
		return port == want
	}
	for _, r := range np.Spec.Ingress {
		if (len(r.From) == 0 || slices.ContainsFunc(r.From, peer)) && (len(r.Ports) == 0 || slices.ContainsFunc(r.Ports, portOK)) {
			return true
		}
	}
	return false
}
