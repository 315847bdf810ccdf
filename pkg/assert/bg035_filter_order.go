package assert

import (
	"container/list"
	"strings"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleFilterOrder: Envoy Gateway runs the rate limit filter after the
// authentication filters (ext_authz, api_key_auth, basic_auth, oauth2,
// jwt_authn) and after ext_proc, where Envoy AI Gateway sets the model header
// (internal/xds/translator/httpfilters.go newOrderedHTTPFilter). An
// EnvoyProxy's spec.filterOrder can move it before them (sortHTTPFilters);
// the rate limit filter then builds its descriptors before the identity
// headers are set: token budgets still charge, but to no principal (Distinct
// rules see no header), and a promoted budget never denies anyone. Checked
// for the EnvoyProxy each budgeted Gateway uses (the Gateway's
// spec.infrastructure.parametersRef, else its GatewayClass's parametersRef).
var ruleFilterOrder = &Rule{
	ID:       "BG035",
	Name:     "filter-order",
	Doc:      "an EnvoyProxy used by a budgeted Gateway does not move the rate limit filter before the authentication filters (or, when budgets select on the model header, before ext_proc or the buffer filter Envoy AI Gateway inserts its ext_proc after)",
	Severity: Error,
	Check: func(p *Pass) error {
		users := envoyProxyUsers(p.Index)
		budgeted := budgetedGateways(p)
		for _, o := range p.Index.Objects {
			if o.Group() != GroupEG || o.Kind != "EnvoyProxy" || manifest.Get(o.Node, "spec", "filterOrder") == nil {
				continue
			}
			var ep egv1a1.EnvoyProxy
			if !decodeTyped(o, &ep) {
				continue
			}
			checkFilterOrder(p, o, ep.Spec.FilterOrder, users[o], budgeted)
		}
		return nil
	},
}

// budgetNeeds is what the rate limit filter must follow on a budgeted Gateway.
type budgetNeeds struct {
	policies []string
	model    bool // a budget rule selects on the model header
}

// budgetedGateways maps each Gateway a budget policy reaches to its needs.
func budgetedGateways(p *Pass) map[GatewayKey]*budgetNeeds {
	out := map[GatewayKey]*budgetNeeds{}
	model := strings.ToLower(p.Options.modelHeader())
	for _, pol := range p.Index.BudgetPolicies() {
		usesModel := false
		for _, r := range pol.Rules {
			for _, hm := range r.Headers() {
				usesModel = usesModel || hm.Name == model
			}
		}
		for _, t := range p.Index.Targets(pol.Obj) {
			gk := GatewayKey{Namespace: t.Gateway.Namespace, Name: t.Gateway.Name}
			if out[gk] == nil {
				out[gk] = &budgetNeeds{}
			}
			out[gk].policies = append(out[gk].policies, pol.Obj.String())
			out[gk].model = out[gk].model || usesModel
		}
	}
	return out
}

// envoyProxyUsers maps each EnvoyProxy of the input to the Gateways of the
// input that use it: through spec.infrastructure.parametersRef, else through
// their GatewayClass's spec.parametersRef.
func envoyProxyUsers(ix *Index) map[*manifest.Object][]GatewayKey {
	find := func(ns, name string) *manifest.Object {
		for _, o := range ix.Objects {
			if o.Group() == GroupEG && o.Kind == "EnvoyProxy" && o.Namespace == ns && o.Name == name {
				return o
			}
		}
		return nil
	}
	classes := map[string]*manifest.Object{}
	for _, o := range ix.Objects {
		ref := manifest.Get(o.Node, "spec", "parametersRef")
		if o.Group() == GroupGateway && o.Kind == "GatewayClass" && manifest.Str(manifest.Get(ref, "kind")) == "EnvoyProxy" {
			classes[o.Name] = find(manifest.Str(manifest.Get(ref, "namespace")), manifest.Str(manifest.Get(ref, "name")))
		}
	}
	out := map[*manifest.Object][]GatewayKey{}
	for _, gw := range ix.Gateways {
		ref := manifest.Get(gw.Node, "spec", "infrastructure", "parametersRef")
		ep := classes[manifest.Str(manifest.Get(gw.Node, "spec", "gatewayClassName"))]
		if manifest.Str(manifest.Get(ref, "kind")) == "EnvoyProxy" {
			if own := find(gw.Namespace, manifest.Str(manifest.Get(ref, "name"))); own != nil && manifest.Get(own.Node, "spec", "filterOrder") != nil {
				ep = own
			}
		}
		if ep != nil {
			out[ep] = append(out[ep], GatewayKey{Namespace: gw.Namespace, Name: gw.Name})
		}
	}
	return out
}

// checkFilterOrder reports an EnvoyProxy whose filter order puts the rate
// limit filter before a filter the budgets of a Gateway using it need first.
func checkFilterOrder(p *Pass, o *manifest.Object, order []egv1a1.FilterPosition, users []GatewayKey, budgeted map[GatewayKey]*budgetNeeds) {
	pos := sortFilterTypes(order)
	at := manifest.Key(manifest.Get(o.Node, "spec"), "filterOrder")
	early := func(model bool) []string {
		var out []string
		for _, f := range needsBefore(model) {
			if pos[string(egv1a1.EnvoyFilterRateLimit)] < pos[f] {
				out = append(out, f)
			}
		}
		return out
	}
	if len(users) == 0 {
		if bad := early(false); len(bad) > 0 {
			p.ReportSeverity(Warning, o, at, "spec.filterOrder", "spec.filterOrder runs %s before %s, and no Gateway of the input uses this EnvoyProxy, so the gate cannot tell whose budgets it affects: on a budgeted Gateway the rate limit descriptors are built before the identity headers are set (token budgets charge no principal)", egv1a1.EnvoyFilterRateLimit, strings.Join(bad, ", "))
		}
		return
	}
	for _, gk := range users {
		needs := budgeted[gk]
		if needs == nil {
			continue
		}
		if bad := early(needs.model); len(bad) > 0 {
			p.Report(o, at, "spec.filterOrder", "spec.filterOrder runs %s before %s on %s (EG's translator, sortHTTPFilters): the budgets of %s build their descriptors before the identity headers are set, so tokens are charged to no principal and a promoted budget never denies; keep the rate limit filter after authentication (drop this entry, or order it after %s)",
				egv1a1.EnvoyFilterRateLimit, strings.Join(bad, ", "), gk, strings.Join(needs.policies, ", "), bad[len(bad)-1])
		}
		if needs.model && aiExtProcAfterRateLimit(pos) {
			p.Report(o, at, "spec.filterOrder", "spec.filterOrder runs %s after %s on %s: Envoy AI Gateway inserts its ext_proc, which sets the model header from the request body, right after the last buffer filter (insertAIGatewayExtProcFilter), so the budgets of %s match the model header the client sent (it is not removed early): a client names a cheaper model and escapes the frontier cap and kill switch; keep the buffer filter before %s",
				egv1a1.EnvoyFilterBuffer, egv1a1.EnvoyFilterRateLimit, gk, strings.Join(needs.policies, ", "), egv1a1.EnvoyFilterRateLimit)
		}
	}
}

// aiExtProcAfterRateLimit tells whether Envoy AI Gateway's router-level
// ext_proc, where the model header is set, lands after the rate limit filter.
// Its extension server inserts that filter after EG has ordered the chain, so
// spec.filterOrder cannot name it: before the first ext_proc, wasm, lua, rbac,
// local rate limit, rate limit, ... filter, or right after the last buffer
// filter when that one comes at or after the insertion point
// (insertAIGatewayExtProcFilter in
// https://github.com/envoyproxy/ai-gateway/blob/v1.1.0/internal/extensionserver/post_translate_modify.go).
// The rate limit filter is one of those insertion points, so only a buffer
// filter ordered after it moves the ext_proc past it.
func aiExtProcAfterRateLimit(pos map[string]int) bool {
	return pos[string(egv1a1.EnvoyFilterBuffer)] > pos[string(egv1a1.EnvoyFilterRateLimit)]
}

// needsBefore lists the filters the rate limit filter must follow.
func needsBefore(model bool) []string {
	out := []string{string(egv1a1.EnvoyFilterExtAuthz), string(egv1a1.EnvoyFilterAPIKeyAuth), string(egv1a1.EnvoyFilterBasicAuth), string(egv1a1.EnvoyFilterOAuth2), string(egv1a1.EnvoyFilterJWTAuthn)}
	if model {
		out = append(out, string(egv1a1.EnvoyFilterExtProc))
	}
	return out
}

// sortFilterTypes returns the position of each filter type in the chain EG
// builds: its default order (newOrderedHTTPFilter, one filter per type), then
// each filterOrder entry moving the filters of its type before the first of
// its `before` type or after the last of its `after` type (sortHTTPFilters,
// in EG v1.9.1 internal/xds/translator/httpfilters.go).
func sortFilterTypes(order []egv1a1.FilterPosition) map[string]int {
	l := list.New()
	for _, f := range defaultFilterTypes() {
		l.PushBack(string(f))
	}
	elem := func(name string) *list.Element {
		for e := l.Front(); e != nil; e = e.Next() {
			if e.Value.(string) == name {
				return e
			}
		}
		return nil
	}
	for _, fp := range order {
		cur := elem(string(fp.Name))
		switch {
		case cur == nil:
		case fp.Before != nil:
			if to := elem(string(*fp.Before)); to != nil {
				l.MoveBefore(cur, to)
			}
		case fp.After != nil:
			if to := elem(string(*fp.After)); to != nil {
				l.MoveAfter(cur, to)
			}
		}
	}
	pos := map[string]int{}
	i := 0
	for e := l.Front(); e != nil; e = e.Next() {
		pos[e.Value.(string)] = i
		i++
	}
	return pos
}

// defaultFilterTypes is the default order of EG v1.9.1's HTTP filter types
// (newOrderedHTTPFilter gives each type its own rank).
func defaultFilterTypes() []egv1a1.EnvoyFilter {
	out := []egv1a1.EnvoyFilter{
		egv1a1.EnvoyFilterCustomResponse, egv1a1.EnvoyFilterHealthCheck, egv1a1.EnvoyFilterFault, egv1a1.EnvoyFilterCORS,
		egv1a1.EnvoyFilterCSRF, egv1a1.EnvoyFilterHeaderMutation, egv1a1.EnvoyFilterExtAuthz, egv1a1.EnvoyFilterAPIKeyAuth,
		egv1a1.EnvoyFilterBasicAuth, egv1a1.EnvoyFilterOAuth2, egv1a1.EnvoyFilterJWTAuthn, egv1a1.EnvoyFilterSessionPersistence,
		egv1a1.EnvoyFilterBuffer, egv1a1.EnvoyFilterLua, egv1a1.EnvoyFilterExtProc, egv1a1.EnvoyFilterWasm,
		egv1a1.EnvoyFilterDynamicModules, egv1a1.EnvoyFilterGeoIP, egv1a1.EnvoyFilterRBAC, egv1a1.EnvoyFilterLocalRateLimit,
		egv1a1.EnvoyFilterRateLimit, egv1a1.EnvoyFilterBandwidthLimit, egv1a1.EnvoyFilterGRPCWeb, egv1a1.EnvoyFilterGRPCStats,
		egv1a1.EnvoyFilterCredentialInjector, egv1a1.EnvoyFilterCompressor, egv1a1.EnvoyFilterDynamicForwardProxy, egv1a1.EnvoyFilterRouter,
	}
	return out
}
