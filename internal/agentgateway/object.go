package agentgateway

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Model returns the *Policy an AgentgatewayPolicy held as Kubernetes' generic
// object decodes to, and any other value as it is. pkg/render hands its
// AgentgatewayPolicies out as *unstructured.Unstructured (this model is not
// part of its API); code of this module that wants the fields switches on
// Model(obj) instead of obj. A value that does not decode (never one render
// wrote: it is the JSON of a Policy) is returned as it is too, so a switch
// that wants a *Policy misses it rather than seeing half a policy.
func Model(obj any) any {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || u.GetAPIVersion() != APIVersion || u.GetKind() != KindPolicy {
		return obj
	}
	j, err := u.MarshalJSON()
	if err != nil {
		return obj
	}
	var p Policy
	if err := json.Unmarshal(j, &p); err != nil {
		return obj
	}
	return &p
}
