package assert

import (
	"fmt"
	"sort"
	"strings"

	"github.com/budgetgen/budgetgen/pkg/manifest"
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
// Only the policies Envoy Gateway keeps count (Index.attachOf: a Conflicted
// SecurityPolicy or ClientTrafficPolicy does nothing). Header removal is
// checked per listener: a ClientTrafficPolicy on a listener replaces the
// Gateway's on that listener (internal/gatewayapi/clienttrafficpolicy.go,
// ProcessClientTrafficPolicies translates sectionName policies first and the
// Gateway's only on listeners not yet claimed), so a listener policy that
// does not remove a header leaves it spoofable there. A header counts as set
// for a Gateway when a SecurityPolicy on it, on the budget policy's listener,
// or on one of its routes sets it (BG030-BG031 check each route).
var ruleIdentity = &Rule{
	ID:       "BG006",
	Name:     "verified-identity",
	Doc:      "headers that select a budget (all but the model header) are set by a SecurityPolicy and removed early by the ClientTrafficPolicy that applies on each listener",
	Severity: Error,
	Check: func(p *Pass) error {
		setters := identitySetters(p.Index)
		model := strings.ToLower(p.Options.modelHeader())
		for _, pol := range p.Index.BudgetPolicies() {
			targets := p.Index.Targets(pol.Obj)
			seen := map[string]bool{}
			for _, r := range pol.Rules {
				for _, hm := range r.Headers() {
					if hm.Name == model || seen[hm.Name] {
						continue
					}
					seen[hm.Name] = true // one finding per header and policy, at its first use
					checkIdentityHeader(p, pol, hm, targets, setters)
				}
			}
		}
		return nil
	},
}

// identitySetters maps each Gateway (and listener, as Section) to the
// headers the SecurityPolicies EG keeps set there from a credential.
// Route-level policies count for their Gateway as a whole (a documented
// limit here; BG031 checks every route).
func identitySetters(ix *Index) map[GatewayKey]map[string]bool {
	setters := map[GatewayKey]map[string]bool{}
	sps := ix.attachOf(kindSecurityPolicy)
	for _, sp := range ix.SecurityPolicies {
		if len(sps.winnersOf(sp)) == 0 {
			continue // Conflicted or unbound everywhere (BG005, BG015)
		}
		hs := credentialHeaders(sp)
		for _, t := range ix.Targets(sp) {
			gk := t.Gateway
			if t.Via != "" {
				gk.Section = ""
			}
			addAll(setters, gk, hs)
		}
	}
	return setters
}

// checkIdentityHeader reports header hm of budget policy pol when, on a
// Gateway the policy targets, no SecurityPolicy sets it, or a listener's
// ClientTrafficPolicy does not remove it.
func checkIdentityHeader(p *Pass, pol *Policy, hm HeaderMatch, targets []Target, setters map[GatewayKey]map[string]bool) {
	at := manifest.Get(hm.Node, "name")
	if len(targets) == 0 {
		if manifest.Get(pol.Obj.Node, "spec", "targetSelectors") != nil {
			return // selectors that select nothing: BG015
		}
		p.Report(pol.Obj, at, hm.Path+".name", "identity header %s: the policy targets no Gateway found in the input, so nothing shows it is set from a verified credential; include the Gateway, SecurityPolicy and ClientTrafficPolicy", hm.Name)
		return
	}
	var unset, kept []string
	for _, t := range targets {
		gk := t.Gateway
		where := gk.Namespace + "/" + gk.Name
		if gk.Section != "" {
			where += " listener " + gk.Section
		}
		if !setters[GatewayKey{gk.Namespace, gk.Name, ""}][hm.Name] && (gk.Section == "" || !setters[gk][hm.Name]) {
			unset = append(unset, where)
		}
		kept = append(kept, hygieneGaps(p.Index, gk, t.Via != "", hm.Name)...)
	}
	if len(unset) > 0 {
		p.Report(pol.Obj, at, hm.Path+".name", "identity header %s is not set from a verified credential on Gateway %s: no SecurityPolicy on it or its routes sets it (jwt claimToHeaders, apiKeyAuth forwardClientIDHeader, extAuth.http headersToBackend), so a client picks its own bucket", hm.Name, strings.Join(dedupe(unset), ", "))
	}
	if len(kept) > 0 {
		p.Report(pol.Obj, at, hm.Path+".name", "identity header %s is not removed from client requests on Gateway %s: the ClientTrafficPolicy that applies there (a listener's replaces the Gateway's) must list it in headers.earlyRequestHeaders.remove, or a client sends its own value where no credential overwrites it", hm.Name, strings.Join(dedupe(kept), ", "))
	}
}

// hygieneGaps lists the places ("ns/name listener l", or "ns/name" when the
// listeners are unknown) of target gk where the ClientTrafficPolicy EG
// applies does not remove header h. A target through a route, or on the whole
// Gateway, covers every listener of the Gateway.
func hygieneGaps(ix *Index, gk GatewayKey, viaRoute bool, h string) []string {
	ctps := ix.attachOf(kindClientTrafficPolicy)
	gw := GatewayKey{Namespace: gk.Namespace, Name: gk.Name}
	listeners := []GatewayKey{gk}
	if gk.Section == "" || viaRoute {
		listeners = []GatewayKey{gw}
		if ls, known := ix.listeners(gw); known && len(ls) > 0 {
			listeners = listeners[:0]
			for _, l := range ls {
				listeners = append(listeners, GatewayKey{gw.Namespace, gw.Name, l})
			}
		}
	}
	var out []string
	for _, l := range listeners {
		eff := ctps.onListener(l)
		where := l.Namespace + "/" + l.Name
		if l.Section != "" {
			where += " listener " + l.Section
		}
		if eff != nil && eff.level == levelListener {
			if other, port := ix.plainHTTPPortShared(l); other != "" {
				out = append(out, fmt.Sprintf("%s (EG refuses %s there: a ClientTrafficPolicy on one of the plain HTTP listeners sharing port %d, with %s, is not allowed, and the Gateway's skips the listener it claimed; target the whole Gateway)", where, eff.Policy, port, other))
				continue
			}
		}
		if eff != nil && removesHeader(eff.Policy, h) {
			continue
		}
		out = append(out, where)
	}
	return out
}

// plainHTTPPortShared returns another plain HTTP listener of l's Gateway on
// l's port, and the port, when l is a plain HTTP listener ("" otherwise).
// Envoy serves such listeners from one HTTP connection manager, so Envoy
// Gateway v1.9.1 refuses a ClientTrafficPolicy targeting one of them by
// sectionName, after claiming the listener, so the Gateway's policy skips it
// as well (internal/gatewayapi/clienttrafficpolicy.go,
// ProcessClientTrafficPolicies and validatePortOverlapForClientTrafficPolicy;
// helpers.go, listenersWithSameHTTPPort: TLS listeners have their own filter
// chain and never overlap).
func (ix *Index) plainHTTPPortShared(l GatewayKey) (string, int64) {
	gw := ix.gatewayObject(l)
	if gw == nil {
		return "", 0
	}
	port := int64(-1)
	for _, n := range manifest.Items(manifest.Get(gw.Node, "spec", "listeners")) {
		if manifest.Str(manifest.Get(n, "name")) == l.Section && manifest.Str(manifest.Get(n, "protocol")) == "HTTP" {
			port, _ = manifest.Int(manifest.Get(n, "port"))
		}
	}
	if port < 0 {
		return "", 0
	}
	for _, n := range manifest.Items(manifest.Get(gw.Node, "spec", "listeners")) {
		name := manifest.Str(manifest.Get(n, "name"))
		if p, _ := manifest.Int(manifest.Get(n, "port")); name != l.Section && p == port && manifest.Str(manifest.Get(n, "protocol")) == "HTTP" {
			return name, port
		}
	}
	return "", 0
}

func removesHeader(ctp *manifest.Object, h string) bool {
	for _, n := range manifest.Items(manifest.Get(ctp.Node, "spec", "headers", "earlyRequestHeaders", "remove")) {
		if strings.EqualFold(manifest.Str(n), h) {
			return true
		}
	}
	return false
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
