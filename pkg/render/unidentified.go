package render

import (
	"slices"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"

	"github.com/budgetgen/budgetgen/pkg/spec"
)

// anyValue is the RE2 expression an unidentified rule's inverted matches
// use: it fully matches every header value that is valid UTF-8, the empty
// value included (Envoy refuses CR, LF and NUL in header values).
const anyValue = ".*"

// principalHeaders are the identity headers of the per-principal budgets
// placed on gw, sorted and without duplicates. A request carrying none of
// them is unidentified on gw: no per-principal budget there can key on it.
// Group budgets and the frontier cap do not count: they key on a group or a
// model, not on who sent the request.
func principalHeaders(bs *spec.BudgetSet, gw spec.GatewayRef) []string {
	var out []string
	for i := range bs.Spec.Budgets {
		b := &bs.Spec.Budgets[i]
		if b.Kind() == spec.KindPerPrincipal && bs.HasBudget(b, gw) {
			out = append(out, b.PerPrincipal)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// unidentifiedSelectors select a request that carries none of hdrs: per
// header a RegularExpression match anyValue with invert: true, ANDed.
//
// Envoy Gateway translates each such match into its own header_value_match
// action with expect_match: false (buildHeaderMatchRateLimitActions in
// internal/xds/translator/ratelimit.go, v1.9.1), and Envoy sends a rate
// limit's descriptor only when every action produces its entry
// (populateDescriptor in source/common/router/router_ratelimit.cc of
// envoyproxy/envoy). A header_value_match entry is produced when
// expect_match equals HeaderUtility::matchHeaders
// (source/common/http/header_utility.cc): for an absent header a
// string_match matcher returns false (only present_match, or
// treat_missing_header_as_empty, which Envoy Gateway does not set, answers
// otherwise; route_components.proto documents it for "header4"), so the
// entry is produced; for a present header anyValue matches, an empty value
// too, and the entry is not. So the descriptor is sent exactly when all
// of hdrs are absent. One caveat: RE2's "." matches only valid UTF-8, so a
// value with invalid UTF-8 (possible only from ext auth, never from a JWT
// claim or an API key client id) counts as absent too and is charged here
// as well as to its own principal.
//
// The matches fit one selector: every per-principal budget adds at least two
// rules (its own and this one), so the 256 rules of a policy (checkLimits)
// hold at most 128 such budgets, hence at most MaxHeadersPerSelector headers.
func unidentifiedSelectors(hdrs []string) []egv1a1.RateLimitSelectCondition {
	matches := make([]egv1a1.HeaderMatch, 0, len(hdrs))
	for _, h := range hdrs {
		matches = append(matches, header(h, egv1a1.HeaderMatchRegularExpression, anyValue, true))
	}
	return []egv1a1.RateLimitSelectCondition{{Headers: matches}}
}
