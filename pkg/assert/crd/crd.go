// Package crd gives the render gate's rule BG007 its validator: every object
// checked against the CRDs Envoy Gateway v1.9.1 embeds (its own and Gateway
// API's), OpenAPI schema and x-kubernetes-validations CEL rules alike, through
// kubectl-validate (internal/crdvalidate). It is separate from pkg/assert so
// the rules build and test without the Kubernetes validation stack.
package crd

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/budgetgen/budgetgen/internal/crdvalidate"
	"github.com/budgetgen/budgetgen/pkg/assert"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

var leadingPath = regexp.MustCompile(`^((?:metadata|spec)(?:\.[A-Za-z0-9_-]+|\[\d+\])*): `)

// Validator returns the assert.Validator to set as assert.Options.Validator.
// The CRDs are compiled into the binary and parsed once per process (seconds,
// on the first call); the validator is safe for concurrent use.
func Validator() (assert.Validator, error) {
	v, err := crdvalidate.Shared()
	if err != nil {
		return nil, fmt.Errorf("load Envoy Gateway CRDs: %w", err)
	}
	return assert.ValidatorFunc(func(ctx context.Context, obj *manifest.Object) ([]assert.FieldError, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		doc, err := obj.Decode()
		if err != nil {
			// A duplicate key and the like: the API server refuses the
			// object too, so it is a finding about it, not a failed run.
			return []assert.FieldError{{Message: "rejected before schema validation, the YAML does not decode: " + err.Error()}}, nil
		}
		verr := v.ValidateObject(doc)
		if verr == nil {
			return nil, nil
		}
		var e *crdvalidate.Error
		if !errors.As(verr, &e) {
			return []assert.FieldError{{Message: verr.Error()}}, nil
		}
		if len(e.Causes) == 0 {
			msg := e.Err.Error()
			fe := assert.FieldError{Message: "rejected by Envoy Gateway's CRDs: " + msg}
			if m := leadingPath.FindStringSubmatch(msg); m != nil {
				fe.Path = m[1]
			}
			return []assert.FieldError{fe}, nil
		}
		out := make([]assert.FieldError, 0, len(e.Causes))
		for _, c := range e.Causes {
			field, msg := c.Field, c.Message
			if strings.Contains(msg, "some validation rules were not checked") {
				continue // a consequence of the other causes, not a problem of its own
			}
			if field == "<nil>" {
				field = ""
			}
			if field == "" {
				// Some causes carry the path only in the message.
				if m := leadingPath.FindStringSubmatch(msg); m != nil {
					field = m[1]
				}
			} else {
				msg = field + ": " + msg
			}
			out = append(out, assert.FieldError{Path: field, Message: msg})
		}
		return out, nil
	}), nil
}
