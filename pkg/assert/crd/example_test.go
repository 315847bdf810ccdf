package crd_test

import (
	"context"
	"fmt"

	"github.com/budgetgen/budgetgen/pkg/assert"
	"github.com/budgetgen/budgetgen/pkg/assert/crd"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// Validator checks each object against Envoy Gateway's CRDs, as the API
// server would; given as assert.Options.Validator, it turns each rejection
// into a BG007 finding at the field.
func Example() {
	v, err := crd.Validator()
	if err != nil {
		fmt.Println(err)
		return
	}
	objs, err := manifest.Parse("policy.yaml", []byte(`apiVersion: gateway.envoyproxy.io/v1alpha1
kind: BackendTrafficPolicy
metadata: {name: budgets, namespace: ai-gateway}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: ai-gateway}]
  rateLimit:
    global:
      rules: [{limit: {requests: 1000000, unit: Days}}]
`), manifest.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	errs, err := v.Validate(context.Background(), objs[0])
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range errs {
		fmt.Println(e.Message)
	}
	rep, err := assert.Run(context.Background(), objs, assert.Options{Validator: v})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, f := range rep.Findings {
		fmt.Printf("%s:%d:%d: %s %s\n", f.File, f.Line, f.Column, f.Rule, f.Message)
	}
	// Output:
	// spec.rateLimit.global.rules[0].limit.unit: Unsupported value: "Days": supported values: "Second", "Minute", "Hour", "Day", "Week", "Month", "Year"
	// policy.yaml:8:49: BG007 spec.rateLimit.global.rules[0].limit.unit: Unsupported value: "Days": supported values: "Second", "Minute", "Hour", "Day", "Week", "Month", "Year"
}
