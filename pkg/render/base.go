package render

import (
	"fmt"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"gopkg.in/yaml.v3"
	sigsyaml "sigs.k8s.io/yaml"

	yamlobj "github.com/budgetgen/budgetgen/pkg/manifest"
	"github.com/budgetgen/budgetgen/pkg/spec"
	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// basePolicy decodes and checks gw's base policy. Decoding is strict: a field
// EG v1.9.1's API does not know would otherwise be dropped from the merged
// policy, and "unchanged" would be a lie. A base policy render cannot merge
// the budgets into is a *yamlpos.Error at the line of the base policy file.
func basePolicy(gw spec.GatewayRef) (*egv1a1.BackendTrafficPolicy, error) {
	f := gw.Base
	objs, err := yamlobj.Parse(f.Path, f.Data, yamlobj.Options{})
	if err != nil {
		return nil, fmt.Errorf("base policy: %w", err)
	}
	if len(objs) != 1 {
		return nil, &yamlpos.Error{File: f.Path, Line: 1, Msg: fmt.Sprintf("holds %d objects, want exactly one BackendTrafficPolicy", len(objs))}
	}
	o := objs[0]
	at := yamlpos.Options{File: f.Path, LinesOnly: true}
	fail := func(n *yaml.Node, field, format string, args ...any) error {
		if n == nil {
			n = o.Node
		}
		return at.Errorf(n, field, format, args...)
	}
	if o.Group() != egv1a1.GroupName || o.Kind != egv1a1.KindBackendTrafficPolicy {
		return nil, fail(yamlobj.Key(o.Node, "kind"), "kind", "is %s %s, want a BackendTrafficPolicy (%s)", o.APIVersion, o.Kind, egv1a1.GroupVersion)
	}
	spec := yamlobj.Get(o.Node, "spec")
	if n := yamlobj.Key(yamlobj.Get(spec, "rateLimit"), "local"); n != nil {
		return nil, fail(n, "spec.rateLimit.local", "a base policy with a local rate limit cannot take the budgets: they are global rules and EG takes one rate limit type per policy; move the local limit to a route-level policy or express it as a global rule")
	}
	if t := yamlobj.Str(yamlobj.Get(spec, "rateLimit", "type")); t != "" && t != string(egv1a1.GlobalRateLimitType) {
		return nil, fail(yamlobj.Get(spec, "rateLimit", "type"), "spec.rateLimit.type", "is %q: the budgets are global rules; drop the deprecated type or set Global", t)
	}
	if ns := o.Namespace; ns != "" && ns != gw.Namespace {
		return nil, fail(yamlobj.Get(o.Node, "metadata", "namespace"), "metadata.namespace", "is %q, but the Gateway %s/%s is in %q: a policy attaches to a Gateway of its own namespace", ns, gw.Namespace, gw.Name, gw.Namespace)
	}
	if n := yamlobj.Key(spec, "targetSelectors"); n != nil {
		return nil, fail(n, "spec.targetSelectors", "a base policy for spec.gateways entry %s/%s must target it by targetRefs, not selectors: the budgets must reach exactly that Gateway", gw.Namespace, gw.Name)
	}
	if n := yamlobj.Key(spec, "targetRef"); n != nil {
		return nil, fail(n, "spec.targetRef", "deprecated; use targetRefs with the one Gateway %s", gw.Name)
	}
	refs := yamlobj.Items(yamlobj.Get(spec, "targetRefs"))
	if len(refs) > 1 {
		return nil, fail(yamlobj.Key(spec, "targetRefs"), "spec.targetRefs", "targets %d objects: the merged policy holds the budgets of Gateway %s only, so it must target that Gateway alone", len(refs), gw.Name)
	}
	for _, r := range refs {
		kind, name, section := yamlobj.Str(yamlobj.Get(r, "kind")), yamlobj.Str(yamlobj.Get(r, "name")), yamlobj.Str(yamlobj.Get(r, "sectionName"))
		if g := yamlobj.Str(yamlobj.Get(r, "group")); g != "" && g != "gateway.networking.k8s.io" || kind != "Gateway" || name != gw.Name || section != gw.SectionName {
			want := "Gateway " + gw.Name
			if gw.SectionName != "" {
				want += " sectionName " + gw.SectionName
			}
			return nil, fail(r, "spec.targetRefs[0]", "targets %s %s (sectionName %q), which conflicts with the spec's %s", kind, name, section, want)
		}
	}
	var btp egv1a1.BackendTrafficPolicy
	if err := sigsyaml.UnmarshalStrict(f.Data, &btp); err != nil {
		return nil, fail(nil, "", "not a valid Envoy Gateway v1.9.1 BackendTrafficPolicy: %v", err)
	}
	return &btp, nil
}

// mergeBase puts the budget rules after the base policy's own global rules.
// Everything else of the base stays as written; budgetgen's labels and the
// rule-budgets annotation are added.
func mergeBase(base *egv1a1.BackendTrafficPolicy, ours *egv1a1.BackendTrafficPolicy, gw spec.GatewayRef) *egv1a1.BackendTrafficPolicy {
	out := base.DeepCopy()
	out.TypeMeta = ours.TypeMeta
	if out.Namespace == "" {
		out.Namespace = gw.Namespace
	}
	if len(out.Spec.TargetRefs) == 0 {
		out.Spec.PolicyTargetReferences = ours.Spec.PolicyTargetReferences
	}
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	for k, v := range ours.Labels {
		out.Labels[k] = v
	}
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	for k, v := range ours.Annotations {
		out.Annotations[k] = v
	}
	if out.Spec.RateLimit == nil {
		out.Spec.RateLimit = &egv1a1.RateLimitSpec{}
	}
	if out.Spec.RateLimit.Global == nil {
		out.Spec.RateLimit.Global = &egv1a1.GlobalRateLimit{}
	}
	out.Spec.RateLimit.Global.Rules = append(out.Spec.RateLimit.Global.Rules, ours.Spec.RateLimit.Global.Rules...)
	return out
}
