package crdvalidate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apiextensions-apiserver/pkg/crdserverscheme"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"sigs.k8s.io/kubectl-validate/pkg/validator"
)

// Why this file exists: kubectl-validate's Validator.Validate builds a new
// customresource strategy for every document, and building one compiles every
// CEL rule of the kind (EG's BackendTrafficPolicy has hundreds): 20-160 ms per
// object, which made `budgetgen assert` take a minute on a 1,000-object repo.
// The apiserver builds that strategy once per CRD version; so do we. Decoding
// (strict fields, defaults) still goes through kubectl-validate's Parse, and
// kinds we hold no CRD for fall back to kubectl-validate unchanged.

// kindValidator is the compiled validation of one CRD version.
type kindValidator struct {
	strategy   rest.RESTCreateStrategy
	namespaced bool
}

// crdVersion locates one served version's schema in a parsed CRD.
type crdVersion struct {
	crd     *apiextensionsv1.CustomResourceDefinition
	version int
}

// parseCRDs indexes every version of every CRD in a YAML stream by GVK.
func parseCRDs(stream []byte) (map[schema.GroupVersionKind]crdVersion, error) {
	out := map[schema.GroupVersionKind]crdVersion{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	for {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		err := dec.Decode(crd)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("parse CRD stream: %w", err)
		}
		if crd.Kind != "CustomResourceDefinition" {
			continue
		}
		for i, v := range crd.Spec.Versions {
			gvk := schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.Kind}
			out[gvk] = crdVersion{crd: crd, version: i}
		}
	}
}

// build compiles the schema validator, structural schema and CEL rules of one
// CRD version, the way the apiserver's CRD handler does.
func (c crdVersion) build(gvk schema.GroupVersionKind) (*kindValidator, error) {
	v := c.crd.Spec.Versions[c.version]
	if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
		return nil, fmt.Errorf("CRD %s version %s has no schema", c.crd.Name, v.Name)
	}
	var props apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &props, nil); err != nil {
		return nil, fmt.Errorf("convert schema of %s: %w", gvk, err)
	}
	schemaValidator, _, err := validation.NewSchemaValidator(&props)
	if err != nil {
		return nil, fmt.Errorf("schema validator for %s: %w", gvk, err)
	}
	ss, err := structuralschema.NewStructural(&props)
	if err != nil {
		return nil, fmt.Errorf("structural schema for %s: %w", gvk, err)
	}
	namespaced := c.crd.Spec.Scope == apiextensionsv1.NamespaceScoped
	params := runtime.NewScheme()
	params.AddUnversionedTypes(gvk.GroupVersion(), &metav1.ListOptions{}, &metav1.GetOptions{}, &metav1.DeleteOptions{})
	typer := validator.UnstructuredObjectTyper{Delegate: params, UnstructuredTyper: crdserverscheme.NewUnstructuredObjectTyper()}
	strat := customresource.NewStrategy(typer, namespaced, gvk, schemaValidator, nil, ss, nil, nil, nil)
	return &kindValidator{strategy: strat, namespaced: namespaced}, nil
}

// validateParsed runs the cached strategy over an object decoded by
// kubectl-validate's Parse, mirroring validator.Validator.Validate.
func (k *kindValidator) validateParsed(obj *unstructured.Unstructured) error {
	obj = &unstructured.Unstructured{Object: maps.Clone(obj.UnstructuredContent())}
	obj.Object["metadata"] = runtime.DeepCopyJSONValue(obj.Object["metadata"])
	if k.namespaced && obj.GetNamespace() == "" {
		obj.SetNamespace("default")
	}
	rest.FillObjectMetaSystemFields(obj)
	return rest.BeforeCreate(k.strategy, request.WithNamespace(context.Background(), obj.GetNamespace()), obj)
}
