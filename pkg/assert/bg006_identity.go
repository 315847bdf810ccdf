package assert

import (
	"sort"
	"strings"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleIdentity: a Distinct selector keys a bucket on a header value. Unless
// the gateway sets that header from a verified credential and strips any
// client-sent copy before auth runs, a client picks its own bucket (a fresh
// value per request) or escapes it.
var ruleIdentity = &Rule{
	ID:       "BG006",
	Name:     "verified-identity",
	Doc:      "identity headers of Distinct selectors are set by a SecurityPolicy and removed early by a ClientTrafficPolicy on the same Gateway",
	Severity: Error,
	Check: func(p *Pass) error {
		setters := map[GatewayKey]map[string]bool{}  // gateway -> headers set from a credential
		removers := map[GatewayKey]map[string]bool{} // gateway -> headers removed early
		for _, sp := range p.Index.SecurityPolicies {
			hs := credentialHeaders(sp)
			for _, t := range p.Index.Targets(sp) {
				gk := GatewayKey{t.Gateway.Namespace, t.Gateway.Name, ""}
				addAll(setters, gk, hs)
			}
		}
		for _, ctp := range p.Index.ClientPolicies {
			var hs []string
			for _, h := range manifest.Items(manifest.Get(ctp.Node, "spec", "headers", "earlyRequestHeaders", "remove")) {
				hs = append(hs, strings.ToLower(manifest.Str(h)))
			}
			for _, t := range p.Index.Targets(ctp) {
				if t.Via == "" {
					addAll(removers, GatewayKey{t.Gateway.Namespace, t.Gateway.Name, ""}, hs)
				}
			}
		}
		for _, pol := range p.Index.BudgetPolicies() {
			targets := p.Index.Targets(pol.Obj)
			seen := map[string]bool{}
			for _, r := range pol.Rules {
				for _, hm := range r.Headers() {
					if hm.Type != "Distinct" || seen[hm.Name] {
						continue
					}
					seen[hm.Name] = true // one finding per header and policy, at its first use
					at := manifest.Get(hm.Node, "name")
					if len(targets) == 0 {
						p.Report(pol.Obj, at, hm.Path+".name", "identity header %s: the policy targets no Gateway found in the input, so nothing shows it is set from a verified credential; include the Gateway, SecurityPolicy and ClientTrafficPolicy", hm.Name)
						continue
					}
					var unset, kept []string
					for _, t := range targets {
						gk := GatewayKey{t.Gateway.Namespace, t.Gateway.Name, ""}
						if !setters[gk][hm.Name] {
							unset = append(unset, gk.Namespace+"/"+gk.Name)
						}
						if !removers[gk][hm.Name] {
							kept = append(kept, gk.Namespace+"/"+gk.Name)
						}
					}
					if len(unset) > 0 {
						p.Report(pol.Obj, at, hm.Path+".name", "identity header %s is not set from a verified credential on Gateway %s: no SecurityPolicy on it or its routes sets it (jwt claimToHeaders, apiKeyAuth forwardClientIDHeader, extAuth.http headersToBackend), so a client picks its own bucket", hm.Name, strings.Join(dedupe(unset), ", "))
					}
					if len(kept) > 0 {
						p.Report(pol.Obj, at, hm.Path+".name", "identity header %s is not removed from client requests on Gateway %s: add it to a ClientTrafficPolicy's headers.earlyRequestHeaders.remove, or a client sends its own value where no credential overwrites it", hm.Name, strings.Join(dedupe(kept), ", "))
					}
				}
			}
		}
		return nil
	},
}

// credentialHeaders lists the headers a SecurityPolicy sets from a verified
// credential, lowercased.
func credentialHeaders(sp *manifest.Object) []string {
	spec := manifest.Get(sp.Node, "spec")
	var hs []string
	for _, prov := range manifest.Items(manifest.Get(spec, "jwt", "providers")) {
		for _, c := range manifest.Items(manifest.Get(prov, "claimToHeaders")) {
			hs = append(hs, manifest.Str(manifest.Get(c, "header")))
		}
	}
	if h := manifest.Str(manifest.Get(spec, "apiKeyAuth", "forwardClientIDHeader")); h != "" {
		hs = append(hs, h)
	}
	for _, h := range manifest.Items(manifest.Get(spec, "extAuth", "http", "headersToBackend")) {
		hs = append(hs, manifest.Str(h))
	}
	for i := range hs {
		hs[i] = strings.ToLower(hs[i])
	}
	return hs
}

func addAll(m map[GatewayKey]map[string]bool, k GatewayKey, hs []string) {
	if m[k] == nil {
		m[k] = map[string]bool{}
	}
	for _, h := range hs {
		m[k][h] = true
	}
}

func dedupe(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
