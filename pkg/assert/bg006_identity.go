package assert

import (
	"sort"
	"strings"

	"github.com/budgetgen/budgetgen/internal/manifest"
)

// ruleIdentity: a header match selects which bucket a request is charged to
// (Distinct: one bucket per value; Exact/RegularExpression: membership of a
// group, or an override's own bucket; inverted: an exclusion). Unless the
// gateway sets that header from a verified credential and strips any
// client-sent copy before auth runs, a client picks its own bucket (a fresh
// value per request), joins a group it is not in, or escapes a cap. The one
// header exempt is the model header, which Envoy AI Gateway sets from the
// request body itself.
//
// Sections: a policy with a sectionName covers that listener only. A header
// counts as removed (or set) for a budget policy only when a policy on the
// whole Gateway, or on the budget policy's own section, removes (or sets) it;
// a ClientTrafficPolicy on one listener does not protect the others.
var ruleIdentity = &Rule{
	ID:       "BG006",
	Name:     "verified-identity",
	Doc:      "headers that select a budget (all but the model header) are set by a SecurityPolicy and removed early by a ClientTrafficPolicy on the same Gateway or listener",
	Severity: Error,
	Check: func(p *Pass) error {
		setters := map[GatewayKey]map[string]bool{}  // gateway -> headers set from a credential
		removers := map[GatewayKey]map[string]bool{} // gateway -> headers removed early
		for _, sp := range p.Index.SecurityPolicies {
			hs := credentialHeaders(sp)
			for _, t := range p.Index.Targets(sp) {
				// Route-level policies count for their Gateway as a whole (a
				// documented limit: routes without one carry no header, so
				// their traffic is not charged, but nothing is spoofed).
				gk := GatewayKey{t.Gateway.Namespace, t.Gateway.Name, t.Gateway.Section}
				if t.Via != "" {
					gk.Section = ""
				}
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
					addAll(removers, GatewayKey{t.Gateway.Namespace, t.Gateway.Name, t.Gateway.Section}, hs)
				}
			}
		}
		model := strings.ToLower(p.Options.modelHeader())
		// covered reports whether m holds header h for a budget policy
		// targeting gk: through a policy on the whole Gateway, or on gk's
		// own section when gk names one.
		covered := func(m map[GatewayKey]map[string]bool, gk GatewayKey, h string) bool {
			if m[GatewayKey{gk.Namespace, gk.Name, ""}][h] {
				return true
			}
			return gk.Section != "" && m[gk][h]
		}
		for _, pol := range p.Index.BudgetPolicies() {
			targets := p.Index.Targets(pol.Obj)
			seen := map[string]bool{}
			for _, r := range pol.Rules {
				for _, hm := range r.Headers() {
					if hm.Name == model || seen[hm.Name] {
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
						gk := t.Gateway
						where := gk.Namespace + "/" + gk.Name
						if gk.Section != "" {
							where += " listener " + gk.Section
						}
						if !covered(setters, gk, hm.Name) {
							unset = append(unset, where)
						}
						if !covered(removers, gk, hm.Name) {
							kept = append(kept, where)
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
