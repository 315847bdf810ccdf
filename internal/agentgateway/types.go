// Package agentgateway models the few fields of agentgateway's
// AgentgatewayPolicy (agentgateway.dev/v1alpha1) that budgetgen renders and
// checks: target refs, traffic.rateLimit.global and backend.tls (the TLS
// agentgateway originates to the rate limit Service). agentgateway's Go API
// module is not available to this build, so the types are small copies of the
// JSON shape, and Validate applies the schema rules of its CRD (required
// fields, enums, item and length limits) as listed in docs/agentgateway.md.
package agentgateway

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// API group, version and kind.
const (
	Group      = "agentgateway.dev"
	APIVersion = Group + "/v1alpha1"
	KindPolicy = "AgentgatewayPolicy"
)

// Schema limits of the CRD (controller/api/v1alpha1/agentgateway/agentgateway_policy_types.go).
const (
	MaxTargetRefs       = 16
	MaxDescriptors      = 16
	MaxEntries          = 16
	MaxDomainLength     = 256   // ShortString
	MaxEntryNameLength  = 64    // TinyString
	MaxExpressionLength = 16384 // CELExpression
)

// Failure modes (global.failureMode); unset means FailClosed.
const (
	FailOpen   = "FailOpen"
	FailClosed = "FailClosed"
)

// Descriptor units (descriptors[].unit); unset means Requests.
const (
	UnitRequests = "Requests"
	UnitTokens   = "Tokens"
)

// Policy is an AgentgatewayPolicy, reduced to the fields budgetgen uses.
type Policy struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       PolicySpec        `json:"spec"`
}

// PolicySpec is spec.
type PolicySpec struct {
	TargetRefs      []TargetRef      `json:"targetRefs,omitempty"`
	TargetSelectors []TargetSelector `json:"targetSelectors,omitempty"`
	Traffic         *Traffic         `json:"traffic,omitempty"`
	Backend         *Backend         `json:"backend,omitempty"`
}

// TargetSelector is LocalPolicyTargetSelectorWithSectionName: every object
// of the policy's namespace with this group and kind whose labels include
// matchLabels. budgetgen renders targetRefs; teams' own policies may select.
type TargetSelector struct {
	Group       string            `json:"group"`
	Kind        string            `json:"kind"`
	MatchLabels map[string]string `json:"matchLabels"`
	SectionName string            `json:"sectionName,omitempty"`
}

// TargetRef is LocalPolicyTargetReferenceWithSectionName.
type TargetRef struct {
	Group       string `json:"group"`
	Kind        string `json:"kind"`
	Name        string `json:"name"`
	SectionName string `json:"sectionName,omitempty"`
}

// Traffic is spec.traffic.
type Traffic struct {
	RateLimit *RateLimit `json:"rateLimit,omitempty"`
}

// RateLimit is RateLimitsOrConditional without local and conditional limits.
type RateLimit struct {
	Global *GlobalRateLimit `json:"global,omitempty"`
}

// GlobalRateLimit is traffic.rateLimit.global.
type GlobalRateLimit struct {
	BackendRef  *BackendRef  `json:"backendRef,omitempty"`
	URL         string       `json:"url,omitempty"`
	FailureMode string       `json:"failureMode,omitempty"`
	Domain      string       `json:"domain"`
	Descriptors []Descriptor `json:"descriptors"`
}

// BackendRef is Gateway API's BackendObjectReference.
type BackendRef struct {
	Group     *string `json:"group,omitempty"`
	Kind      string  `json:"kind,omitempty"`
	Name      string  `json:"name"`
	Namespace string  `json:"namespace,omitempty"`
	Port      *int32  `json:"port,omitempty"`
}

// Descriptor is one rate limit descriptor.
type Descriptor struct {
	Entries       []Entry `json:"entries"`
	Unit          string  `json:"unit,omitempty"`
	Cost          string  `json:"cost,omitempty"`
	LimitOverride string  `json:"limitOverride,omitempty"`
}

// Entry is a descriptor entry: its value is a CEL expression.
type Entry struct {
	Name       string `json:"name"`
	Expression string `json:"expression"`
}
