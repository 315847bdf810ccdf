package assert

import (
	"encoding/json"
	"fmt"
	"strings"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// credential is one way a SecurityPolicy authenticates a request, with the
// headers it sets from the verified credential (lowercased).
type credential struct {
	// What names it: "JWT provider idp", "apiKeyAuth", "extAuth", "basicAuth", "oidc".
	What string
	// Headers it sets: claimToHeaders, forwardClientIDHeader, extAuth.http.headersToBackend.
	Headers []string
	// Owner is the policy the credential comes from (the route's or, when
	// merged, the parent's); Path is its field there.
	Owner *manifest.Object
	Path  string
	// JWT is true for a JWT provider: a request passes with any one of the
	// providers, and with every other configured method (each is its own
	// Envoy filter that rejects a request lacking its credential).
	JWT bool
}

// Sets reports whether the credential sets one of hs.
func (c credential) Sets(hs map[string]bool) bool {
	for _, h := range c.Headers {
		if hs[h] {
			return true
		}
	}
	return false
}

// effectiveSecurity returns the SecurityPolicy spec EG applies for (eff,
// parent): eff's own, or, when eff sets mergeType and has a parent, the
// parent merged with eff as internal/utils/merge.go (Merge) does it - a
// strategic merge patch over the typed SecurityPolicy, or an RFC 7386 JSON
// merge patch - in mergeSecurityPolicy (internal/gatewayapi/securitypolicy.go).
// owner tells which policy a top-level spec field came from. Computed once
// per pair of policies.
func (ix *Index) effectiveSecurity(eff, parent *attachment) (*egv1a1.SecurityPolicySpec, func(field string) *manifest.Object, error) {
	if eff.Merge == "" {
		parent = nil
	}
	key := [2]*manifest.Object{eff.Policy, nil}
	if parent != nil {
		key[1] = parent.Policy
	}
	if r, ok := ix.security[key]; ok {
		return r.spec, r.owner, r.err
	}
	spec, owner, err := effectiveSecurity(eff, parent)
	if ix.security == nil {
		ix.security = map[[2]*manifest.Object]securityResult{}
	}
	ix.security[key] = securityResult{spec, owner, err}
	return spec, owner, err
}

type securityResult struct {
	spec  *egv1a1.SecurityPolicySpec
	owner func(field string) *manifest.Object
	err   error
}

func effectiveSecurity(eff, parent *attachment) (spec *egv1a1.SecurityPolicySpec, owner func(field string) *manifest.Object, err error) {
	own := func(string) *manifest.Object { return eff.Policy }
	route, err := objectJSON(eff.Policy)
	if err != nil || eff.Merge == "" || parent == nil {
		spec, err = decodeSecuritySpec(route, err)
		return spec, own, err
	}
	base, err := objectJSON(parent.Policy)
	if err != nil {
		return nil, own, err
	}
	var merged []byte
	switch eff.Merge {
	case string(egv1a1.StrategicMerge):
		merged, err = strategicpatch.StrategicMergePatch(base, route, egv1a1.SecurityPolicy{})
	case string(egv1a1.JSONMerge):
		merged, err = jsonMergePatch(base, route)
	default:
		err = fmt.Errorf("unsupported mergeType %q", eff.Merge)
	}
	spec, err = decodeSecuritySpec(merged, err)
	owner = func(field string) *manifest.Object {
		if manifest.Get(eff.Policy.Node, "spec", field) != nil {
			return eff.Policy
		}
		return parent.Policy
	}
	return spec, owner, err
}

func objectJSON(o *manifest.Object) ([]byte, error) {
	m, err := o.Decode()
	if err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

func decodeSecuritySpec(data []byte, err error) (*egv1a1.SecurityPolicySpec, error) {
	if err != nil {
		return nil, err
	}
	var sp egv1a1.SecurityPolicy
	if err := json.Unmarshal(data, &sp); err != nil {
		return nil, err
	}
	return &sp.Spec, nil
}

// jsonMergePatch applies patch to doc as RFC 7386 says (github.com/evanphx/json-patch
// MergePatch, which EG uses): objects merge key by key, null deletes, any
// other value (lists included) replaces.
func jsonMergePatch(doc, patch []byte) ([]byte, error) {
	var d, p any
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		return nil, err
	}
	return json.Marshal(mergeValue(d, p))
}

func mergeValue(doc, patch any) any {
	pm, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	dm, ok := doc.(map[string]any)
	if !ok {
		dm = map[string]any{}
	}
	for k, v := range pm {
		if v == nil {
			delete(dm, k)
			continue
		}
		dm[k] = mergeValue(dm[k], v)
	}
	return dm
}

// credentials lists the ways spec authenticates a request.
func credentials(spec *egv1a1.SecurityPolicySpec, owner func(string) *manifest.Object) []credential {
	var out []credential
	if spec.JWT != nil {
		for i, pr := range spec.JWT.Providers {
			c := credential{What: "JWT provider " + pr.Name, Owner: owner("jwt"), Path: fmt.Sprintf("spec.jwt.providers[%d]", i), JWT: true}
			for _, h := range pr.ClaimToHeaders {
				c.Headers = append(c.Headers, strings.ToLower(h.Header))
			}
			out = append(out, c)
		}
	}
	if a := spec.APIKeyAuth; a != nil {
		c := credential{What: "apiKeyAuth", Owner: owner("apiKeyAuth"), Path: "spec.apiKeyAuth"}
		if a.ForwardClientIDHeader != nil {
			c.Headers = []string{strings.ToLower(*a.ForwardClientIDHeader)}
		}
		out = append(out, c)
	}
	if e := spec.ExtAuth; e != nil {
		c := credential{What: "extAuth", Owner: owner("extAuth"), Path: "spec.extAuth"}
		if e.HTTP != nil {
			for _, h := range e.HTTP.HeadersToBackend {
				c.Headers = append(c.Headers, strings.ToLower(h))
			}
		}
		out = append(out, c)
	}
	if spec.BasicAuth != nil {
		out = append(out, credential{What: "basicAuth", Owner: owner("basicAuth"), Path: "spec.basicAuth"})
	}
	if spec.OIDC != nil {
		out = append(out, credential{What: "oidc", Owner: owner("oidc"), Path: "spec.oidc"})
	}
	return out
}
