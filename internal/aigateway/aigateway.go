// Package aigateway models the few Envoy AI Gateway (aigateway.envoyproxy.io)
// fields budgetgen reads and writes: an AIGatewayRoute's parentRefs and
// llmRequestCosts, and a GatewayConfig's globalLLMRequestCosts. Its Go module
// is not a dependency, so these are written from its public API
// (api/v1alpha1 and api/v1beta1: ai_gateway_route.go, gateway_config.go,
// shared_types.go; internal/controller for the Gateway annotation). Reading is
// lenient: every field not listed here is ignored, so a newer AI Gateway
// field never fails a run.
package aigateway

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// API facts of Envoy AI Gateway.
const (
	// Group is the API group; v1alpha1 and v1beta1 are both served.
	Group = "aigateway.envoyproxy.io"
	// Version is the version budgetgen renders (v1alpha1 is deprecated).
	Version           = "v1beta1"
	KindRoute         = "AIGatewayRoute"
	KindGatewayConfig = "GatewayConfig"
	// GatewayConfigAnnotation on a Gateway names its GatewayConfig (same namespace).
	GatewayConfigAnnotation = "aigateway.envoyproxy.io/gateway-config"
	// MetadataNamespace is the dynamic metadata namespace the AI Gateway
	// filter writes every llmRequestCosts key into.
	MetadataNamespace = "io.envoy.ai_gateway"
)

// LLMRequestCost types (shared_types.go LLMRequestCostType).
const (
	CostInputToken              = "InputToken"
	CostCachedInputToken        = "CachedInputToken"
	CostCacheCreationInputToken = "CacheCreationInputToken"
	CostOutputToken             = "OutputToken"
	CostTotalToken              = "TotalToken"
	CostReasoningToken          = "ReasoningToken"
	CostCEL                     = "CEL"
)

// CostTypes lists the LLMRequestCost types in the API's order.
var CostTypes = []string{CostInputToken, CostCachedInputToken, CostCacheCreationInputToken, CostOutputToken, CostTotalToken, CostReasoningToken, CostCEL}

// LLMRequestCost is one metadata key the AI Gateway filter computes and writes.
type LLMRequestCost struct {
	MetadataKey string `json:"metadataKey"`
	Type        string `json:"type"`
	// CEL is the expression when Type is CEL.
	CEL string `json:"cel,omitempty"`
}

// Cost is an LLMRequestCost read from a manifest, with its node.
type Cost struct {
	Key  string
	Type string
	// CEL is the expression of a CEL cost ("" otherwise).
	CEL  string
	Node *yaml.Node
}

// ParentRef is a Gateway an AIGatewayRoute attaches to.
type ParentRef struct {
	Namespace, Name string
	Node            *yaml.Node
}

// Route is an AIGatewayRoute as the gate sees it.
type Route struct {
	Obj     *manifest.Object
	Parents []ParentRef
	// Costs is spec.llmRequestCosts; CostsNode is that list (nil when absent).
	Costs     []Cost
	CostsNode *yaml.Node
	// Overrides are the backendRefs that set modelNameOverride
	// (spec.rules[].backendRefs[], ai_gateway_route.go): AI Gateway sends
	// their backend that model name and puts it in x-ai-eg-model, which is
	// the model a CEL cost sees (internal/extproc/processor_impl.go).
	Overrides []ModelOverride
}

// ModelOverride is one backendRef's modelNameOverride.
type ModelOverride struct {
	Backend, Model string
	// Node is the modelNameOverride value; Path its field path.
	Node *yaml.Node
	Path string
}

// Writes reports whether the route lists key in spec.llmRequestCosts.
func (r *Route) Writes(key string) bool { return writes(r.Costs, key) }

// Cost returns the route's own entry for key (nil when it has none).
func (r *Route) Cost(key string) *Cost { return find(r.Costs, key) }

// GatewayConfig is a GatewayConfig as the gate sees it.
type GatewayConfig struct {
	Obj   *manifest.Object
	Costs []Cost // spec.globalLLMRequestCosts
}

// Writes reports whether the GatewayConfig lists key in spec.globalLLMRequestCosts.
func (g *GatewayConfig) Writes(key string) bool { return writes(g.Costs, key) }

// Cost returns the GatewayConfig's entry for key (nil when it has none).
func (g *GatewayConfig) Cost(key string) *Cost { return find(g.Costs, key) }

func find(cs []Cost, key string) *Cost {
	for i := range cs {
		if cs[i].Key == key {
			return &cs[i]
		}
	}
	return nil
}

func writes(cs []Cost, key string) bool {
	for _, c := range cs {
		if c.Key == key {
			return true
		}
	}
	return false
}

// ReadRoute reads an AIGatewayRoute. parentRefs of another kind than Gateway
// are skipped (the API allows only Gateway); the namespace defaults to the
// route's.
func ReadRoute(o *manifest.Object) *Route {
	r := &Route{Obj: o}
	for _, pr := range manifest.Items(manifest.Get(o.Node, "spec", "parentRefs")) {
		if k := manifest.Str(manifest.Get(pr, "kind")); k != "" && k != "Gateway" {
			continue
		}
		ns := manifest.Str(manifest.Get(pr, "namespace"))
		if ns == "" {
			ns = o.Namespace
		}
		r.Parents = append(r.Parents, ParentRef{Namespace: ns, Name: manifest.Str(manifest.Get(pr, "name")), Node: pr})
	}
	r.CostsNode = manifest.Get(o.Node, "spec", "llmRequestCosts")
	r.Costs = readCosts(r.CostsNode)
	for i, rule := range manifest.Items(manifest.Get(o.Node, "spec", "rules")) {
		for j, br := range manifest.Items(manifest.Get(rule, "backendRefs")) {
			n := manifest.Get(br, "modelNameOverride")
			if m := manifest.Str(n); m != "" {
				r.Overrides = append(r.Overrides, ModelOverride{Backend: manifest.Str(manifest.Get(br, "name")), Model: m, Node: n,
					Path: fmt.Sprintf("spec.rules[%d].backendRefs[%d].modelNameOverride", i, j)})
			}
		}
	}
	return r
}

// ReadGatewayConfig reads a GatewayConfig.
func ReadGatewayConfig(o *manifest.Object) *GatewayConfig {
	return &GatewayConfig{Obj: o, Costs: readCosts(manifest.Get(o.Node, "spec", "globalLLMRequestCosts"))}
}

func readCosts(list *yaml.Node) []Cost {
	var out []Cost
	for _, c := range manifest.Items(list) {
		out = append(out, Cost{Key: manifest.Str(manifest.Get(c, "metadataKey")), Type: manifest.Str(manifest.Get(c, "type")), CEL: manifest.Str(manifest.Get(c, "cel")), Node: c})
	}
	return out
}

// GatewayConfigName is the GatewayConfig a Gateway references through its
// annotation ("" when it has none).
func GatewayConfigName(gateway *manifest.Object) string {
	return manifest.Str(manifest.Get(gateway.Node, "metadata", "annotations", GatewayConfigAnnotation))
}

// GatewayConfigObject is a GatewayConfig for rendering: only
// spec.globalLLMRequestCosts is set.
type GatewayConfigObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   ObjectMeta        `json:"metadata"`
	Spec       GatewayConfigSpec `json:"spec"`
}

// ObjectMeta is the metadata budgetgen renders.
type ObjectMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// GatewayConfigSpec holds the global costs of every route of the Gateways
// referencing the GatewayConfig; a route's own llmRequestCosts entry with the
// same key takes precedence.
type GatewayConfigSpec struct {
	GlobalLLMRequestCosts []LLMRequestCost `json:"globalLLMRequestCosts"`
}
