package assert

import (
	"errors"
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleAgentgatewayJWT: agentgateway evaluates every entry of a rate limit
// descriptor as CEL; when one fails (a claim the token lacks, or no verified
// JWT at all: the variable jwt is then absent) it drops the descriptor, and
// when it drops them all it makes no rate limit call
// (crates/agentgateway/src/http/remoteratelimit.rs, build_request and
// eval_descriptor). jwtAuthentication mode Optional admits requests without a
// token, Permissive also those whose token fails verification, and neither
// attaches claims (crates/agentgateway/src/http/jwt.rs, Jwt::apply): with
// descriptors that read jwt and can fail, those requests run unbudgeted. A
// verified token without the claim does the same in any mode. budgetgen
// renders entries that cannot fail (coalesce(string(jwt["c"]),
// "budgetgen/no-claim"): one shared, capped bucket); this rule evaluates each
// entry of a budget policy without claims and without a JWT (cel-go with
// agentgateway's coalesce and default, internal/agentgateway) and reports the
// entries that fail and the modes that let such requests through.
var ruleAgentgatewayJWT = &Rule{
	ID:       "BG034",
	Name:     "agentgateway-jwt",
	Doc:      "agentgateway budget descriptors cannot fail on a request that lacks the claim or a verified JWT, and no jwtAuthentication mode Optional/Permissive admits requests a descriptor would skip",
	Severity: Error,
	Check: func(p *Pass) error {
		eval, err := agentgateway.NewEvaluator()
		if err != nil {
			return err
		}
		for _, b := range agentgatewayBudgetPolicies(p.Index) {
			absent := checkEntriesFail(p, eval, b)
			if len(absent) == 0 {
				continue
			}
			for _, j := range jwtPoliciesFor(p.Index, b) {
				mode := manifest.Get(j.Node, "spec", "traffic", "jwtAuthentication", "mode")
				if m := manifest.Str(mode); m == "Optional" || m == "Permissive" {
					p.Report(j, mode, "spec.traffic.jwtAuthentication.mode", "mode %s admits requests without a verified JWT and attaches no claims (crates/agentgateway/src/http/jwt.rs): on them %s of %s fail%s, agentgateway drops the descriptor and makes no rate limit call, so they run unbudgeted; set mode: Strict, or render the budgets again (budgetgen renders entries that cannot fail)",
						m, strings.Join(absent, ", "), b, plural(len(absent)))
				}
			}
		}
		return nil
	},
}

func plural(n int) string {
	if n == 1 {
		return "s"
	}
	return ""
}

// checkEntriesFail reports each descriptor entry of b that fails for a
// verified token lacking its claim, and returns the entries (as paths) that
// fail for a request without a verified JWT.
func checkEntriesFail(p *Pass, eval *agentgateway.Evaluator, b *manifest.Object) (absent []string) {
	for i, d := range manifest.Items(manifest.Get(b.Node, "spec", "traffic", "rateLimit", "global", "descriptors")) {
		for j, e := range manifest.Items(manifest.Get(d, "entries")) {
			expr := manifest.Str(manifest.Get(e, "expression"))
			path := fmt.Sprintf("%s.descriptors[%d].entries[%d].expression", agwGlobalPath, i, j)
			if _, err := eval.Eval(expr, nil); err != nil {
				if errors.Is(err, agentgateway.ErrUnmodelled) {
					continue // outside what the gate can evaluate (BG020 checks the variables)
				}
				absent = append(absent, fmt.Sprintf("descriptors[%d] entry %s", i, manifest.Str(manifest.Get(e, "name"))))
			}
			if _, err := eval.Eval(expr, map[string]any{}); err != nil && !errors.Is(err, agentgateway.ErrUnmodelled) {
				p.Report(b, manifest.Get(e, "expression"), path, "%s: %s fails for a verified JWT without that claim (%v): agentgateway drops the descriptor and, with none left, makes no rate limit call, so the token's holder runs unbudgeted; wrap it: coalesce(%s, %q) charges such requests to one shared bucket (what budgetgen renders)",
					path, expr, err, expr, agentgateway.NoClaim)
			} else if err == nil {
				checkClaimTypes(p, eval, b, manifest.Get(e, "expression"), path, expr)
			}
		}
	}
	return absent
}

// oddClaims are JSON values of each type but string a verified token's claim
// can hold (serde_json values, crates/agentgateway/src/http/jwt.rs Claims).
var oddClaims = []struct {
	what  string
	value any
}{
	{"a list", []any{"x"}}, {"an object", map[string]any{"x": "y"}}, {"null", nil}, {"a number", 7}, {"a boolean", true},
}

// checkClaimTypes reports an entry that evaluates for a missing claim but
// fails when a claim it reads holds another JSON type: agentgateway's
// default() replaces only a missing key and null (crates/celx/src/general.rs),
// string() refuses a list, a map and null (crates/cel-fork/cel/src/functions.rs),
// and a value that is not a string drops the descriptor
// (crates/agentgateway/src/http/remoteratelimit.rs, eval_descriptor).
func checkClaimTypes(p *Pass, eval *agentgateway.Evaluator, b *manifest.Object, node *yaml.Node, path, expr string) {
	claims, err := agentgateway.Claims(expr)
	if err != nil {
		return
	}
	for _, c := range claims {
		var bad []string
		for _, o := range oddClaims {
			if _, err := eval.Eval(expr, map[string]any{c: o.value}); err != nil && !errors.Is(err, agentgateway.ErrUnmodelled) {
				bad = append(bad, o.what)
			}
		}
		if len(bad) > 0 {
			p.Report(b, node, path, "%s: %s fails when the verified JWT's claim %q is %s: agentgateway drops the descriptor (default() replaces only a missing claim or null, string() refuses lists, objects and null, and a value must be a string), so whoever can give that claim another type (an identity provider passing a multi-valued attribute as a list) runs unbudgeted; use coalesce(string(jwt[%q]), %q), which charges any other type to one shared bucket (what budgetgen renders)",
				path, expr, c, strings.Join(bad, ", "), c, agentgateway.NoClaim)
			return
		}
	}
}

// jwtPoliciesFor lists the AgentgatewayPolicies with a jwtAuthentication on
// a Gateway budget policy b targets, on a ListenerSet of the input joining
// one, or on a route attached to one.
func jwtPoliciesFor(ix *Index, b *manifest.Object) []*manifest.Object {
	gws := agwGatewayTargets(ix, b)
	var out []*manifest.Object
	for _, o := range ix.Objects {
		if o.Kind != agentgateway.KindPolicy || o.Group() != agentgateway.Group || manifest.Get(o.Node, "spec", "traffic", "jwtAuthentication") == nil {
			continue
		}
		if sameGateway(agwGatewayTargets(ix, o), gws) || routesOn(ix, o, gws) || listenerSetsOn(ix, o, gws) {
			out = append(out, o)
		}
	}
	return out
}

// listenerSetsOn reports whether o targets a ListenerSet of the input that
// joins one of the Gateways gws as a whole.
func listenerSetsOn(ix *Index, o *manifest.Object, gws []GatewayKey) bool {
	for _, t := range agwKindTargets(ix, o, "ListenerSet", GroupGateway) {
		if gw, ok := listenerSetParent(ix, o.Namespace, t.name, GroupGateway); ok && agwWholeGateway(gws, gw) {
			return true
		}
	}
	return false
}

func sameGateway(a, b []GatewayKey) bool {
	for _, x := range a {
		for _, y := range b {
			if x.Namespace == y.Namespace && x.Name == y.Name && (x.Section == "" || y.Section == "" || x.Section == y.Section) {
				return true
			}
		}
	}
	return false
}

func routesOn(ix *Index, o *manifest.Object, gws []GatewayKey) bool {
	for _, r := range agwRouteTargets(ix, o) {
		if agwRoutesOn(ix, r.route, gws) != "" {
			return true
		}
	}
	return false
}
