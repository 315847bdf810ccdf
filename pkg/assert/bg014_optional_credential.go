package assert

import (
	"slices"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleOptionalCredential: a SecurityPolicy that lets requests through
// without the credential sets no identity header on them. Such a request
// matches no Distinct (per-principal) rule - Envoy sends no descriptor for a
// missing header - and is charged to no principal's budget (in a policy
// budgetgen rendered, only to each per-principal budget's one shared
// budgetgen/no-claim bucket, sharedUnidentified). JWT `optional: true`
// admits requests with no token, JWT `failOpen: true` admits those whose
// token fails verification, ext auth `failOpen: true` admits every request
// when the auth service is down.
var ruleOptionalCredential = &Rule{
	ID:       "BG014",
	Name:     "credential-required",
	Doc:      "a SecurityPolicy that sets a budget's identity header does not let requests through without the credential (jwt.optional, jwt.failOpen, extAuth.failOpen)",
	Severity: Error,
	Check:    checkOptionalCredential,
}

// laxSetting is one setting of a SecurityPolicy that admits requests
// without the credential, and the identity headers that credential sets.
type laxSetting struct {
	node       *yaml.Node
	path, what string
	headers    []string
}

func checkOptionalCredential(p *Pass) error {
	budgeted := budgetedHeaders(p)
	if len(budgeted) == 0 {
		return nil
	}
	for _, sp := range p.Index.SecurityPolicies {
		found := laxSettings(manifest.Get(sp.Node, "spec"))
		if len(found) == 0 {
			continue
		}
		targets := p.Index.Targets(sp)
		for _, l := range found {
			var hit, pols []string
			for _, t := range targets {
				gk := GatewayKey{t.Gateway.Namespace, t.Gateway.Name, ""}
				for _, h := range l.headers {
					if pol, ok := budgeted[gk][h]; ok {
						hit = append(hit, h)
						pols = append(pols, pol)
					}
				}
			}
			if len(hit) == 0 {
				continue
			}
			hit, pols = dedupe(hit), dedupe(pols)
			sort.Strings(pols)
			shared := ""
			for _, bp := range p.Index.BudgetPolicies() {
				if slices.Contains(pols, bp.Obj.String()) {
					if shared = sharedUnidentified(bp); shared != "" {
						break
					}
				}
			}
			p.Report(sp, l.node, l.path, "%s: true lets %s through without setting %s: they match no per-principal rule of %s and spend no principal's budget%s; remove %s (or set it to false)",
				l.path, l.what, strings.Join(hit, ", "), strings.Join(pols, ", "), shared, l.path)
		}
	}
	return nil
}

// budgetedHeaders maps each budgeted Gateway to the identity headers its
// budget policies select on (not the model header), each with the first
// policy that does.
func budgetedHeaders(p *Pass) map[GatewayKey]map[string]string {
	model := strings.ToLower(p.Options.modelHeader())
	budgeted := map[GatewayKey]map[string]string{}
	for _, pol := range p.Index.BudgetPolicies() {
		for _, t := range p.Index.Targets(pol.Obj) {
			gk := GatewayKey{t.Gateway.Namespace, t.Gateway.Name, ""}
			for _, r := range pol.Rules {
				for _, hm := range r.Headers() {
					if hm.Name == model {
						continue
					}
					if budgeted[gk] == nil {
						budgeted[gk] = map[string]string{}
					}
					if _, ok := budgeted[gk][hm.Name]; !ok {
						budgeted[gk][hm.Name] = pol.Obj.String()
					}
				}
			}
		}
	}
	return budgeted
}

// laxSettings are the settings of a SecurityPolicy spec that admit requests
// without the credential whose headers they would set.
func laxSettings(spec *yaml.Node) []laxSetting {
	var jwtHeaders []string
	for _, prov := range manifest.Items(manifest.Get(spec, "jwt", "providers")) {
		for _, c := range manifest.Items(manifest.Get(prov, "claimToHeaders")) {
			jwtHeaders = append(jwtHeaders, strings.ToLower(manifest.Str(manifest.Get(c, "header"))))
		}
	}
	var extHeaders []string
	for _, h := range manifest.Items(manifest.Get(spec, "extAuth", "http", "headersToBackend")) {
		extHeaders = append(extHeaders, strings.ToLower(manifest.Str(h)))
	}
	var found []laxSetting
	for _, c := range []struct {
		path, what string
		hs         []string
	}{
		{"spec.jwt.optional", "requests without a JWT", jwtHeaders},
		{"spec.jwt.failOpen", "requests whose JWT fails verification", jwtHeaders},
		{"spec.extAuth.failOpen", "every request while the ext auth service cannot answer", extHeaders},
	} {
		n := manifest.Get(spec, strings.Split(strings.TrimPrefix(c.path, "spec."), ".")...)
		if on, _ := manifest.Bool(n); on && len(c.hs) > 0 {
			found = append(found, laxSetting{node: n, path: c.path, what: c.what, headers: c.hs})
		}
	}
	return found
}
