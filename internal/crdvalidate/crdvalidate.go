// Package crdvalidate checks Kubernetes objects offline against Envoy Gateway's
// own CRDs (and the Gateway API CRDs EG embeds), evaluating both the OpenAPI
// schema and the x-kubernetes-validations CEL rules, the way EG itself does in
// internal/gatewayapi/resource/validator.go.
//
// Building the validator parses every CRD and is slow (seconds); build one
// with New and reuse it, or use Shared.
package crdvalidate

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	envoygateway "github.com/envoyproxy/gateway"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/kubectl-validate/pkg/validator"
	"sigs.k8s.io/yaml"
)

// Validator validates documents against a fixed set of CRDs. It is safe for
// concurrent use (calls are serialized: kubectl-validate caches per GVK in a
// plain map).
type Validator struct {
	mu    sync.Mutex
	v     *validator.Validator
	crds  map[schema.GroupVersionKind]crdVersion     // every CRD version we were given
	kinds map[schema.GroupVersionKind]*kindValidator // compiled on first use, then reused
}

// New builds a validator over Envoy Gateway's embedded CRDs
// (envoygateway.GatewayCRDs: Gateway API and gateway.envoyproxy.io).
func New() (*Validator, error) {
	return NewFromCRDs(envoygateway.GatewayCRDs)
}

// NewFromCRDs builds a validator over a YAML stream of CustomResourceDefinitions.
func NewFromCRDs(crds []byte) (*Validator, error) {
	idx, err := parseCRDs(crds)
	if err != nil {
		return nil, fmt.Errorf("load CRDs: %w", err)
	}
	client, err := newCRDClient(idx) // see openapi.go
	if err != nil {
		return nil, fmt.Errorf("load CRDs: %w", err)
	}
	v, err := validator.New(client)
	if err != nil {
		return nil, fmt.Errorf("load CRDs: %w", err)
	}
	return &Validator{v: v, crds: idx, kinds: map[schema.GroupVersionKind]*kindValidator{}}, nil
}

var (
	sharedOnce sync.Once
	shared     *Validator
	sharedErr  error
)

// Shared returns one process-wide validator over EG's embedded CRDs, built on
// first use. The CRDs are compiled into the binary, so there is nothing to configure.
func Shared() (*Validator, error) {
	sharedOnce.Do(func() { shared, sharedErr = New() })
	return shared, sharedErr
}

// Cause is one field-level problem.
type Cause struct {
	Field   string // e.g. "spec.rateLimit.global.rules[0].cost"
	Message string
}

// Error is a document that does not validate. Causes lists field-level
// problems when the validator reported them (schema and CEL failures).
type Error struct {
	APIVersion, Kind, Namespace, Name string
	Causes                            []Cause
	Err                               error
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", e.Kind, e.Name)
	if e.Namespace != "" {
		b.Reset()
		fmt.Fprintf(&b, "%s %s/%s", e.Kind, e.Namespace, e.Name)
	}
	if len(e.Causes) == 0 {
		fmt.Fprintf(&b, ": %v", e.Err)
		return b.String()
	}
	for i, c := range e.Causes {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		if c.Field != "" {
			b.WriteString(c.Field)
			b.WriteString(": ")
		}
		b.WriteString(c.Message)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Validate checks one YAML or JSON document (an object with apiVersion and
// kind). Unknown kinds, unknown fields, schema violations and failed CEL rules
// are errors; the error is an *Error with field-level Causes where known.
func (v *Validator) Validate(doc []byte) error {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return &Error{Err: fmt.Errorf("parse document: %w", err)}
	}
	v.mu.Lock()
	err := v.validate(doc)
	v.mu.Unlock()
	if err == nil {
		return nil
	}
	return newError(meta.APIVersion, meta.Kind, meta.Metadata.Namespace, meta.Metadata.Name, err)
}

// newError wraps a validation failure with the object's identity and the
// field-level causes the apiserver machinery reported.
func newError(apiVersion, kind, namespace, name string, err error) *Error {
	e := &Error{APIVersion: apiVersion, Kind: kind, Namespace: namespace, Name: name, Err: err}
	var se *apierrors.StatusError
	if errors.As(err, &se) && se.ErrStatus.Details != nil {
		for _, c := range se.ErrStatus.Details.Causes {
			e.Causes = append(e.Causes, Cause{Field: c.Field, Message: c.Message})
		}
	}
	return e
}

// validate is cmd.ValidateDocument with the per-kind strategy cached (see
// strategy.go). Callers hold v.mu: kubectl-validate caches in plain maps.
func (v *Validator) validate(doc []byte) error {
	gvk, parsed, err := v.v.Parse(doc)
	if err != nil {
		return err
	}
	k, err := v.kindFor(gvk)
	if err != nil {
		return err
	}
	if k == nil {
		return v.v.Validate(parsed)
	}
	return k.validateParsed(parsed)
}

// ValidateObject validates a typed API object or a map. Kinds we hold a CRD
// for are checked in memory (JSON round trip, no YAML); others go through
// Validate. Verdicts and messages are those of Validate.
func (v *Validator) ValidateObject(obj any) error {
	doc, err := json.Marshal(obj)
	if err != nil {
		return &Error{Err: fmt.Errorf("marshal object: %w", err)}
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(doc); err != nil {
		return v.Validate(doc)
	}
	gvk := u.GroupVersionKind()
	v.mu.Lock()
	k, err := v.kindFor(gvk)
	if k == nil || err != nil {
		v.mu.Unlock()
		return v.Validate(doc)
	}
	err = k.coerce(u)
	if err == nil {
		err = k.validateParsed(u)
	}
	v.mu.Unlock()
	if err == nil {
		return nil
	}
	return newError(u.GetAPIVersion(), u.GetKind(), u.GetNamespace(), u.GetName(), err)
}

// kindFor returns the compiled validation of gvk, building it on first use,
// or nil when no CRD defines gvk. Callers hold v.mu.
func (v *Validator) kindFor(gvk schema.GroupVersionKind) (*kindValidator, error) {
	if k, ok := v.kinds[gvk]; ok {
		return k, nil
	}
	src, known := v.crds[gvk]
	if !known {
		return nil, nil
	}
	k, err := src.build(gvk)
	if err != nil {
		return nil, err
	}
	v.kinds[gvk] = k
	return k, nil
}
