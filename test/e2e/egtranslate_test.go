package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/pmezard/go-difflib/difflib"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/budgetgen/budgetgen/internal/rlsconfig"
)

// TestEnvoyGatewayTranslatesLikeRlsconfig is a differential test of
// internal/rlsconfig, the model of Envoy Gateway's translator that the e2e
// tests drive, against EG's translator itself (the version budgetgen's go.mod
// pins, built by hack/install-deps.sh). For the committed example render,
// every spec in pkg/render/testdata (between them every rule shape render
// emits), two specs at EG's limits and internal/rlsconfig's own selector
// fixtures, with fixture Gateways and HTTPRoutes:
//
//   - `egctl x translate --to gateway-api,xds -t route --add-missing-resources`
//     must accept every policy and route, and give every route exactly the
//     rate_limits rlsconfig.RouteRateLimits derives, per domain (proto.Equal);
//   - egrlsconfig (EG's BuildRateLimitServiceConfig over the same translation;
//     egctl cannot print the rate limit service's config) must serve exactly
//     the domains, descriptors, limits and shadow modes of rlsconfig.Configs.
func TestEnvoyGatewayTranslatesLikeRlsconfig(t *testing.T) {
	egctl, egrls := egTools(t)
	cases := egCases(t)
	var all []*egv1a1.BackendTrafficPolicy
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // each case runs its own two processes
			compareWithEG(t, egctl, egrls, c)
		})
		all = append(all, c.btps...)
	}
	if missing := missingShapes(all); len(missing) > 0 {
		t.Errorf("no case has a rule of these shapes: %s", strings.Join(missing, "; "))
	}
}

// compareWithEG translates one case with EG and compares the result with
// internal/rlsconfig's.
func compareWithEG(t *testing.T, egctl, egrls string, c egCase) {
	fixtures, listeners := egFixtures(c.targets)
	in := slices.Concat(c.manifests, [][]byte{fixtures})
	path := filepath.Join(t.TempDir(), "resources.yaml")
	if err := os.WriteFile(path, bytes.Join(in, []byte("\n---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	out := runTool(t, egctl, "x", "translate", "--from", "gateway-api", "--to", "gateway-api,xds",
		"-t", "route", "--add-missing-resources", "-o", "json", "-f", path)
	var o egctlOutput
	if err := json.Unmarshal(out, &o); err != nil {
		t.Fatalf("egctl output: %v", err)
	}
	if len(o.BackendTrafficPolicies) != len(c.btps) {
		t.Fatalf("egctl printed %d BackendTrafficPolicies, the case has %d", len(o.BackendTrafficPolicies), len(c.btps))
	}
	if bad := o.notAccepted(); len(bad) > 0 {
		t.Fatalf("Envoy Gateway did not accept:\n%s", strings.Join(bad, "\n"))
	}
	routes, limits := compareRoutes(t, c.btps, listeners, o.routeRateLimits(t))
	domains := compareConfigs(t, c.btps, parseRateLimitConfigs(t, runTool(t, egrls, path)))
	t.Logf("compared %d routes (%d rate_limits) and %d domains' rate limit configs", routes, limits, domains)
}

// compareRoutes checks every route of every fixture listener: two routes,
// each with the rate_limits rlsconfig derives from the policy targeting the
// listener (none if no policy does). It returns the number of routes and of
// their rate_limits.
func compareRoutes(t *testing.T, btps []*egv1a1.BackendTrafficPolicy, listeners []egListener, got map[string]egRoute) (int, int) {
	t.Helper()
	want := map[string]map[string][]*routev3.RateLimit{}
	for _, l := range listeners {
		want[l.namespace+"/"+l.gateway+"/"+l.name] = map[string][]*routev3.RateLimit{}
		p := policyFor(t, btps, l)
		if p == nil {
			continue
		}
		rls, err := rlsconfig.RouteRateLimits(p)
		if err != nil {
			t.Fatalf("rlsconfig.RouteRateLimits(%s/%s): %v", p.Namespace, p.Name, err)
		}
		want[l.namespace+"/"+l.gateway+"/"+l.name] = rls
	}
	routes, limits := map[string]int{}, 0
	names := make([]string, 0, len(got))
	for name := range got {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		r := got[name]
		w, ok := want[r.config]
		if !ok {
			t.Errorf("route %s is in route configuration %s, which no fixture listener has", name, r.config)
			continue
		}
		routes[r.config]++
		for _, rls := range r.limits {
			limits += len(rls)
		}
		diffRouteLimits(t, name, w, r.limits)
	}
	for cfg := range want {
		if routes[cfg] != 2 {
			t.Errorf("route configuration %s has %d routes, want the fixture's 2", cfg, routes[cfg])
		}
	}
	return len(names), limits
}

// policyFor is the BackendTrafficPolicy that applies to a listener: one
// targeting it by section name, else one targeting its Gateway.
func policyFor(t *testing.T, btps []*egv1a1.BackendTrafficPolicy, l egListener) *egv1a1.BackendTrafficPolicy {
	t.Helper()
	var gateway, section []*egv1a1.BackendTrafficPolicy
	for _, p := range btps {
		for _, tl := range policyTargets(p.Namespace, p.Spec.TargetRefs) {
			switch {
			case tl.namespace != l.namespace || tl.gateway != l.gateway:
			case tl.name == "":
				gateway = append(gateway, p)
			case tl.name == l.name:
				section = append(section, p)
			}
		}
	}
	if len(section) > 1 || len(gateway) > 1 {
		t.Fatalf("listener %v: several policies target it alike; EG would keep one, which this test does not model", l)
	}
	if len(section) == 1 {
		return section[0]
	}
	if len(gateway) == 1 {
		return gateway[0]
	}
	return nil
}

// diffRouteLimits reports a route whose rate_limits differ from rlsconfig's,
// per domain, with a diff of the first few that differ.
func diffRouteLimits(t *testing.T, route string, want, got map[string][]*routev3.RateLimit) {
	t.Helper()
	domains := map[string]bool{}
	for d := range want {
		domains[d] = true
	}
	for d := range got {
		domains[d] = true
	}
	for _, d := range slices.Sorted(maps.Keys(domains)) {
		if n, diff := diffLists("rate_limits", want[d], got[d], ruleOfLimit); n > 0 {
			t.Errorf("route %s, domain %s: %d of %d rate_limits differ, Envoy Gateway's (+) from rlsconfig.RouteRateLimits' (-):\n%s",
				route, d, n, max(len(want[d]), len(got[d])), diff)
		}
	}
}

// compareConfigs checks that EG serves, for every domain, exactly the config
// rlsconfig.Configs gives, and no other domain. It returns the number of
// domains.
func compareConfigs(t *testing.T, btps []*egv1a1.BackendTrafficPolicy, got map[string][]*rlsconfv3.RateLimitConfig) int {
	t.Helper()
	want, err := rlsconfig.Configs(btps)
	if err != nil {
		t.Fatalf("rlsconfig.Configs: %v", err)
	}
	byDomain := map[string]*rlsconfv3.RateLimitConfig{}
	for _, c := range want {
		byDomain[c.Domain] = c
	}
	served := map[string]bool{}
	for key, cfgs := range got {
		for _, g := range cfgs {
			served[g.Domain] = true
			w, ok := byDomain[g.Domain]
			if !ok {
				t.Errorf("Gateway %s: Envoy Gateway serves domain %s, which rlsconfig.Configs does not", key, g.Domain)
				continue
			}
			if w.Name != g.Name {
				t.Errorf("Gateway %s, domain %s: Envoy Gateway names the config %q, rlsconfig.Configs %q", key, g.Domain, g.Name, w.Name)
			}
			if n, diff := diffLists("descriptors", w.Descriptors, g.Descriptors, (*rlsconfv3.RateLimitDescriptor).GetKey); n > 0 {
				t.Errorf("Gateway %s, domain %s: %d of %d rule descriptors differ, Envoy Gateway's (+) from rlsconfig.Configs' (-):\n%s",
					key, g.Domain, n, max(len(w.Descriptors), len(g.Descriptors)), diff)
			}
		}
	}
	for d := range byDomain {
		if !served[d] {
			t.Errorf("rlsconfig.Configs has domain %s, which Envoy Gateway does not serve", d)
		}
	}
	return len(served)
}

// maxDiffs is how many differing list elements a failure shows: a policy of
// 256 rules that are all off prints enough with a few.
const maxDiffs = 3

// diffLists counts the elements of two lists that differ (an element only
// one list has counts) and diffs the first maxDiffs of them, each headed by
// its index and label (the rule it belongs to).
func diffLists[M proto.Message](name string, want, got []M, label func(M) string) (int, string) {
	var b strings.Builder
	n := 0
	for i := range max(len(want), len(got)) {
		var w, g proto.Message
		var l string
		if i < len(want) {
			w, l = want[i], label(want[i])
		}
		if i < len(got) {
			g, l = got[i], label(got[i])
		}
		if w != nil && g != nil && proto.Equal(w, g) {
			continue
		}
		if n++; n <= maxDiffs {
			fmt.Fprintf(&b, "%s[%d] (%s):\n%s", name, i, l, protoDiff(w, g))
		}
	}
	if n > maxDiffs {
		fmt.Fprintf(&b, "... and %d more\n", n-maxDiffs)
	}
	return n, b.String()
}

// ruleOfLimit is the rule a rate_limit counts for: its first action's
// generic_key value (<ns>/<policy>/rule/<i>).
func ruleOfLimit(rl *routev3.RateLimit) string {
	if a := rl.GetActions(); len(a) > 0 {
		return a[0].GetGenericKey().GetDescriptorValue()
	}
	return "no actions"
}

// protoDiff is a unified diff of two messages' multi-line protojson; a nil
// message is empty.
func protoDiff(want, got proto.Message) string {
	text := func(m proto.Message) string {
		if m == nil {
			return ""
		}
		b, _ := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(m) // a message built or parsed here always marshals
		return string(b)
	}
	diff, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: difflib.SplitLines(text(want)), B: difflib.SplitLines(text(got)),
		FromFile: "rlsconfig", ToFile: "Envoy Gateway", Context: 3,
	})
	if err != nil {
		return err.Error()
	}
	return diff
}
