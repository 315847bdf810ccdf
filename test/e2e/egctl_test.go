package e2e

import (
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// egModule is Envoy Gateway's Go module: budgetgen's go.mod pins the version
// whose translator internal/rlsconfig models.
const egModule = "github.com/envoyproxy/gateway"

// egTools returns the paths of egctl and egrlsconfig, which
// hack/install-deps.sh builds from hack/tools/egctl into .tools/bin. Both
// must be built from the Envoy Gateway version budgetgen's go.mod requires:
// a comparison with another version's translator proves nothing. Under
// CI=true a missing tool fails the test; elsewhere it skips.
func egTools(t *testing.T) (egctl, egrlsconfig string) {
	t.Helper()
	want := egVersion(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, name := range []string{"egctl", "egrlsconfig"} {
		p := filepath.Join(root, ".tools", "bin", name)
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is required under CI=true: hack/install-deps.sh builds it into .tools/bin", name)
			}
			t.Skipf("%s not installed (hack/install-deps.sh builds it into .tools/bin)", name)
		}
		bi, err := buildinfo.ReadFile(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if got := builtFrom(bi, egModule); got != want {
			t.Fatalf("%s was built from %s %q, budgetgen's go.mod requires %s: update hack/tools/egctl/go.mod, then run hack/install-deps.sh", p, egModule, got, want)
		}
		paths = append(paths, p)
	}
	return paths[0], paths[1]
}

// egVersion is the Envoy Gateway version budgetgen's module builds with (a
// test binary records no dependencies, so the go command tells).
func egVersion(t *testing.T) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}", egModule)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	v := strings.TrimSpace(string(out))
	if err != nil || v == "" {
		t.Fatalf("go list -m %s: %q, %v", egModule, v, err)
	}
	return v
}

// builtFrom is the version of module mod in a binary's build: its main
// module or a dependency (after replacement).
func builtFrom(bi *debug.BuildInfo, mod string) string {
	if bi.Main.Path == mod {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == mod {
			if d.Replace != nil {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return ""
}

// runTool runs a tool and returns its standard output; a failure fails the
// test with its standard error.
func runTool(t *testing.T, path string, args ...string) []byte {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), path, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(path), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// egctlOutput is what `egctl x translate --to gateway-api,xds -t route -o
// json` prints: the resources with the statuses EG gave them, and per xDS IR
// key ("<namespace>/<gateway>") a RoutesConfigDump.
type egctlOutput struct {
	BackendTrafficPolicies []egv1a1.BackendTrafficPolicy `json:"backendTrafficPolicies"`
	ClientTrafficPolicies  []egv1a1.ClientTrafficPolicy  `json:"clientTrafficPolicies"`
	HTTPRoutes             []gwapiv1.HTTPRoute           `json:"httpRoutes"`
	Xds                    map[string]struct {
		DynamicRouteConfigs []struct {
			RouteConfig struct {
				Name         string `json:"name"`
				VirtualHosts []struct {
					Routes []struct {
						Name                 string                     `json:"name"`
						TypedPerFilterConfig map[string]json.RawMessage `json:"typedPerFilterConfig"`
					} `json:"routes"`
				} `json:"virtualHosts"`
			} `json:"routeConfig"`
		} `json:"dynamicRouteConfigs"`
	} `json:"xds"`
}

// rateLimitFilter prefixes the name of each Envoy rate limit filter EG adds,
// one per domain ("envoy.filters.http.ratelimit/<domain>"); a route's
// per-filter config for it is a RateLimitPerRoute.
const rateLimitFilter = "envoy.filters.http.ratelimit/"

// egRoute is one xDS route: its listener's route configuration
// ("<namespace>/<gateway>/<listener>") and its rate_limits by domain.
type egRoute struct {
	config string
	limits map[string][]*routev3.RateLimit
}

// routeRateLimits extracts every route's rate limits, keyed by route name.
func (o *egctlOutput) routeRateLimits(t *testing.T) map[string]egRoute {
	t.Helper()
	out := map[string]egRoute{}
	for _, dump := range o.Xds {
		for _, rc := range dump.DynamicRouteConfigs {
			for _, vh := range rc.RouteConfig.VirtualHosts {
				for _, r := range vh.Routes {
					er := egRoute{config: rc.RouteConfig.Name, limits: map[string][]*routev3.RateLimit{}}
					for name, raw := range r.TypedPerFilterConfig {
						domain, ok := strings.CutPrefix(name, rateLimitFilter)
						if !ok {
							continue
						}
						var a anypb.Any
						per := &ratelimitv3.RateLimitPerRoute{}
						if err := protojson.Unmarshal(raw, &a); err != nil {
							t.Fatalf("route %s, %s: %v", r.Name, name, err)
						}
						if err := a.UnmarshalTo(per); err != nil {
							t.Fatalf("route %s, %s: %v", r.Name, name, err)
						}
						if per.Domain != domain {
							t.Errorf("route %s: filter %s has domain %q", r.Name, name, per.Domain)
						}
						er.limits[domain] = per.RateLimits
					}
					out[r.Name] = er
				}
			}
		}
	}
	return out
}

// notAccepted lists the policies and routes EG did not accept, with the
// conditions it gave them.
func (o *egctlOutput) notAccepted() []string {
	var out []string
	check := func(kind, ns, name string, ancestors []gwapiv1.PolicyAncestorStatus) {
		if len(ancestors) == 0 {
			out = append(out, fmt.Sprintf("%s %s/%s: attached to nothing", kind, ns, name))
		}
		for _, a := range ancestors {
			for _, c := range a.Conditions {
				if c.Type == string(gwapiv1.PolicyConditionAccepted) && c.Status != "True" {
					out = append(out, fmt.Sprintf("%s %s/%s: %s: %s", kind, ns, name, c.Reason, c.Message))
				}
			}
		}
	}
	for _, p := range o.BackendTrafficPolicies {
		check("BackendTrafficPolicy", p.Namespace, p.Name, p.Status.Ancestors)
	}
	for _, p := range o.ClientTrafficPolicies {
		check("ClientTrafficPolicy", p.Namespace, p.Name, p.Status.Ancestors)
	}
	for _, r := range o.HTTPRoutes {
		for _, parent := range r.Status.Parents {
			for _, c := range parent.Conditions {
				if c.Status != "True" {
					out = append(out, fmt.Sprintf("HTTPRoute %s/%s: %s %s: %s", r.Namespace, r.Name, c.Type, c.Reason, c.Message))
				}
			}
		}
	}
	return out
}

// parseRateLimitConfigs reads egrlsconfig's output: per xDS IR key, the
// RateLimitConfig messages EG's rate limit runner serves.
func parseRateLimitConfigs(t *testing.T, data []byte) map[string][]*rlsconfv3.RateLimitConfig {
	t.Helper()
	var raw map[string][]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("egrlsconfig output: %v", err)
	}
	out := map[string][]*rlsconfv3.RateLimitConfig{}
	for key, msgs := range raw {
		out[key] = []*rlsconfv3.RateLimitConfig{}
		for _, m := range msgs {
			c := &rlsconfv3.RateLimitConfig{}
			if err := protojson.Unmarshal(m, c); err != nil {
				t.Fatalf("egrlsconfig output for %s: %v", key, err)
			}
			out[key] = append(out[key], c)
		}
	}
	return out
}

// egListener is one listener of a fixture Gateway.
type egListener struct{ namespace, gateway, name string }

// egFixtures is what EG needs beside the policies to translate them: a
// GatewayClass; per Gateway a policy targets, the Gateway, with a listener
// "http" and one per section name a policy targets; per listener two
// HTTPRoutes (one shared bucket across routes is checked on both). Backend
// Services are left to --add-missing-resources.
func egFixtures(targets []egListener) ([]byte, []egListener) {
	var b strings.Builder
	b.WriteString("apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: envoy-gateway}\n" +
		"spec: {controllerName: gateway.envoyproxy.io/gatewayclass-controller}\n")
	byGateway := map[[2]string][]string{}
	var gateways [][2]string
	for _, l := range targets {
		k := [2]string{l.namespace, l.gateway}
		if _, ok := byGateway[k]; !ok {
			gateways = append(gateways, k)
			byGateway[k] = []string{"http"}
		}
		if l.name != "" && !slices.Contains(byGateway[k], l.name) {
			byGateway[k] = append(byGateway[k], l.name)
		}
	}
	var listeners []egListener
	for _, gw := range gateways {
		fmt.Fprintf(&b, "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: %s, namespace: %s}\n"+
			"spec:\n  gatewayClassName: envoy-gateway\n  listeners:\n", gw[1], gw[0])
		for i, l := range byGateway[gw] {
			fmt.Fprintf(&b, "  - {name: %s, protocol: HTTP, port: %d}\n", l, 8080+i)
			listeners = append(listeners, egListener{gw[0], gw[1], l})
		}
		for _, l := range byGateway[gw] {
			for _, r := range []string{"a", "b"} {
				fmt.Fprintf(&b, "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: %s-%s-%s, namespace: %s}\n"+
					"spec:\n  parentRefs: [{name: %s, sectionName: %s}]\n"+
					"  rules:\n  - matches: [{path: {type: PathPrefix, value: /%s}}]\n    backendRefs: [{name: backend, port: 8080}]\n",
					gw[1], l, r, gw[0], gw[1], l, r)
			}
		}
	}
	return []byte(b.String()), listeners
}
