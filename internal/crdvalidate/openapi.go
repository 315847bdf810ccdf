package crdvalidate

import (
	_ "embed"
	"encoding/json"
	"fmt"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/openapi"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"sigs.k8s.io/kubectl-validate/pkg/openapiclient/groupversion"
)

// Why this file exists: kubectl-validate's openapiclient.NewLocalCRDFiles
// (pkg/openapiclient/local_crds.go) turns CRDs into the OpenAPI documents its
// validator reads, but importing package openapiclient links the embedded
// built-in Kubernetes schemas of every release
// (pkg/openapiclient/builtins, 79 MB), which budgetgen never reads: BG007
// checks Envoy Gateway and Gateway API kinds only, all defined by the CRDs
// we hold. This client does what NewLocalCRDFiles does for those CRDs, and
// kubectl-validate's validator (decoding, schema, CEL) is used unchanged.

// objectMetaSchemas is kubectl-validate's pkg/openapiclient/local_crds_metadata.json
// (Apache-2.0), the ObjectMeta schema (and its dependencies) the API server
// injects into every CRD's metadata.
//
//go:embed objectmeta_schemas.json
var objectMetaSchemas []byte

// crdClient is an openapi.Client serving one OpenAPI document per group
// version of the CRDs it was given.
type crdClient struct {
	paths map[string]openapi.GroupVersion
}

func (c *crdClient) Paths() (map[string]openapi.GroupVersion, error) { return c.paths, nil }

// newCRDClient builds the documents from the parsed CRD versions.
func newCRDClient(crds map[schema.GroupVersionKind]crdVersion) (*crdClient, error) {
	docs := map[schema.GroupVersion]*spec3.OpenAPI{}
	for gvk, cv := range crds {
		sch, err := cv.kubeOpenAPI(gvk)
		if err != nil {
			return nil, err
		}
		key := fmt.Sprintf("%s/%s.%s", gvk.Group, gvk.Version, gvk.Kind)
		doc, ok := docs[gvk.GroupVersion()]
		if !ok {
			doc = &spec3.OpenAPI{Components: &spec3.Components{Schemas: map[string]*spec.Schema{}}}
			docs[gvk.GroupVersion()] = doc
		}
		doc.Components.Schemas[key] = sch
	}
	paths := map[string]openapi.GroupVersion{}
	for gv, doc := range docs {
		// Each document gets its own copy: the validator may annotate schemas.
		var meta map[string]*spec.Schema
		if err := json.Unmarshal(objectMetaSchemas, &meta); err != nil {
			return nil, fmt.Errorf("object metadata schemas: %w", err)
		}
		for name, s := range meta {
			doc.Components.Schemas[name] = s
		}
		paths[fmt.Sprintf("apis/%s/%s", gv.Group, gv.Version)] = groupversion.NewForOpenAPI(doc)
	}
	return &crdClient{paths: paths}, nil
}

// kubeOpenAPI is the OpenAPI schema of one CRD version as the API server
// publishes it: the structural schema, the GVK and scope extensions
// kubectl-validate reads, and the injected metadata, apiVersion and kind.
func (c crdVersion) kubeOpenAPI(gvk schema.GroupVersionKind) (*spec.Schema, error) {
	v := c.crd.Spec.Versions[c.version]
	if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
		return nil, fmt.Errorf("CRD %s version %s has no schema", c.crd.Name, v.Name)
	}
	var props apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &props, nil); err != nil {
		return nil, fmt.Errorf("convert schema of %s: %w", gvk, err)
	}
	ss, err := structuralschema.NewStructural(&props)
	if err != nil {
		return nil, fmt.Errorf("structural schema for %s: %w", gvk, err)
	}
	sch := ss.ToKubeOpenAPI()
	sch.AddExtension("x-kubernetes-group-version-kind", []any{map[string]any{"group": gvk.Group, "version": gvk.Version, "kind": gvk.Kind}})
	sch.AddExtension("x-kubectl-validate-scope", string(c.crd.Spec.Scope))
	if sch.Properties == nil {
		sch.Properties = map[string]spec.Schema{}
	}
	sch.Properties["metadata"] = spec.Schema{SchemaProps: spec.SchemaProps{
		AllOf:   []spec.Schema{{SchemaProps: spec.SchemaProps{Ref: spec.MustCreateRef("#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")}}},
		Default: map[string]any{},
	}}
	for _, f := range []string{"apiVersion", "kind"} {
		sch.Properties[f] = spec.Schema{SchemaProps: spec.SchemaProps{Default: "", Type: spec.StringOrArray{"string"}}}
	}
	return sch, nil
}
