package crdvalidate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apiextensions-apiserver/pkg/crdserverscheme"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
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
	strategy        rest.RESTCreateStrategy
	namespaced      bool
	ss              *structuralschema.Structural
	preserveUnknown bool // x-kubernetes-preserve-unknown-fields at the root
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
	preserve := props.XPreserveUnknownFields != nil && *props.XPreserveUnknownFields
	return &kindValidator{strategy: strat, namespaced: namespaced, ss: ss, preserveUnknown: preserve}, nil
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

// coerce does to an object already in memory what kubectl-validate's strict
// decoder does to a document (crd_decoder.go: unstructuredSchemaCoercer.apply,
// then the defaulter): unknown fields are errors with their paths, metadata is
// coerced, nulls pruned and schema defaults applied. It lets ValidateObject skip
// the YAML round trip, which was most of BG007's remaining cost.
func (k *kindValidator) coerce(u *unstructured.Unstructured) error {
	var unknown []string
	objectMeta, foundMeta, metaUnknown, err := schemaobjectmeta.GetObjectMetaWithOptions(u.Object, schemaobjectmeta.ObjectMetaOptions{ReturnUnknownFieldPaths: true})
	if err != nil {
		return err
	}
	unknown = append(unknown, metaUnknown...)
	if !k.preserveUnknown {
		unknown = append(unknown, structuralpruning.PruneWithOptions(u.Object, k.ss, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})...)
		structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, k.ss)
	}
	// CoerceWithOptions returns a *field.Error: compare it before it becomes an
	// error interface, or a typed nil would read as a failure.
	ferr, paths := schemaobjectmeta.CoerceWithOptions(nil, u.Object, k.ss, false, schemaobjectmeta.CoerceOptions{ReturnUnknownFieldPaths: true})
	if ferr != nil {
		return ferr
	}
	unknown = append(unknown, paths...)
	if foundMeta {
		if err := schemaobjectmeta.SetObjectMeta(u.Object, objectMeta); err != nil {
			return err
		}
	}
	if len(unknown) > 0 {
		errs := make([]error, 0, len(unknown))
		for _, f := range unknown {
			parts := strings.Split(f, ".")
			p := field.NewPath(parts[0])
			for _, c := range parts[1:] {
				p = p.Child(c)
			}
			errs = append(errs, field.Invalid(p, field.OmitValueType{}, "value provided for unknown field"))
		}
		return errors.Join(errs...)
	}
	structuraldefaulting.Default(u.Object, k.ss)
	return nil
}
