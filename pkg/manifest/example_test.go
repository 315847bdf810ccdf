package manifest_test

import (
	"errors"
	"fmt"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// Parse reads every object of a multi-document stream (a List contributes its
// items) and keeps each one's YAML node, so a check can name the line and
// column of the field it objects to.
func Example() {
	src := []byte(`apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ai-gateway, namespace: ai-gateway}
---
apiVersion: v1
kind: List
items:
  - apiVersion: gateway.envoyproxy.io/v1alpha1
    kind: BackendTrafficPolicy
    metadata: {name: budgets, namespace: ai-gateway}
    spec:
      rateLimit:
        global:
          rules: [{limit: {requests: 1000000, unit: Day}}]
`)
	objs, err := manifest.Parse("policies.yaml", src, manifest.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, o := range objs {
		fmt.Printf("%s:%d:%d: %s (group %q)\n", o.File, o.Line(), o.Column(), o, o.Group())
	}
	rules := manifest.Get(objs[1].Node, "spec", "rateLimit", "global", "rules")
	limit := manifest.Get(manifest.Items(rules)[0], "limit", "unit")
	fmt.Printf("rules[0].limit.unit %s at line %d, column %d\n", manifest.Str(limit), limit.Line, limit.Column)

	_, err = manifest.Parse("policies.yaml", []byte("apiVersion: v1\nkind: ConfigMap\n---\nname: not an object\n"), manifest.Options{})
	fmt.Println(err)
	fmt.Println("ErrNotAnObject:", errors.Is(err, manifest.ErrNotAnObject))
	// Output:
	// policies.yaml:1:1: Gateway ai-gateway/ai-gateway (group "gateway.networking.k8s.io")
	// policies.yaml:8:5: BackendTrafficPolicy ai-gateway/budgets (group "gateway.envoyproxy.io")
	// rules[0].limit.unit Day at line 14, column 53
	// policies.yaml:4:1: not a Kubernetes object: document has no apiVersion or kind
	// ErrNotAnObject: true
}
