package crd

import (
	"context"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

func TestValidatorMapsCausesToPaths(t *testing.T) {
	v, err := Validator()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, doc, path, msg string
	}{
		{"CEL", "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {name: a, namespace: b}\nspec:\n  rateLimit:\n    global:\n      rules: [{limit: {requests: 1, unit: Day}}]\n", "spec", "either targetRef or targetRefs must be used"},
		{"valid", "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {name: a, namespace: b}\nspec:\n  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: g}]\n  rateLimit:\n    global:\n      rules: [{limit: {requests: 1, unit: Day}}]\n", "", ""},
		{"unknown field (path only in the message)", "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {name: a, namespace: b}\nspec: {bogus: 1}\n", "spec.bogus", "unknown field"},
		{"enum", "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {name: a, namespace: b}\nspec:\n  rateLimit:\n    global:\n      rules: [{limit: {requests: 1, unit: Days}}]\n", "spec.rateLimit.global.rules[0].limit.unit", `Unsupported value: "Days"`},
		{"unknown kind", "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: Nope\nmetadata: {name: a, namespace: b}\n", "", "kind Nope not found"},
		{"duplicate key", "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {name: a, namespace: b}\nspec:\n  a: 1\n  a: 2\n", "", `mapping key "a" already defined`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := manifest.Parse("t.yaml", []byte(tc.doc), manifest.Options{})
			if err != nil {
				t.Fatal(err)
			}
			errs, err := v.Validate(context.Background(), objs[0])
			if err != nil {
				t.Fatal(err)
			}
			if tc.msg == "" {
				if len(errs) != 0 {
					t.Fatalf("valid object rejected: %+v", errs)
				}
				return
			}
			if len(errs) != 1 || errs[0].Path != tc.path || !strings.Contains(errs[0].Message, tc.msg) {
				t.Errorf("got %+v, want one error at %q containing %q", errs, tc.path, tc.msg)
			}
		})
	}
}
