package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/budgetgen/budgetgen/internal/safetext"
	"github.com/budgetgen/budgetgen/pkg/render"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

// renderedObject is what the summary reads from a rendered object.
type renderedObject struct {
	Metadata struct {
		Namespace   string            `json:"namespace"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		TargetRefs []struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"targetRefs"`
		RateLimit struct {
			Global struct {
				Rules []any `json:"rules"`
			} `json:"global"`
		} `json:"rateLimit"`
		Traffic struct {
			RateLimit struct {
				Global struct {
					Descriptors []struct {
						Entries []struct {
							Name       string `json:"name"`
							Expression string `json:"expression"`
						} `json:"entries"`
					} `json:"descriptors"`
				} `json:"global"`
			} `json:"rateLimit"`
		} `json:"traffic"`
	} `json:"spec"`
}

// writeRenderSummary tells what render -o wrote: the files of each output,
// and per Gateway of the spec its objects with their rate limit rules (or
// agentgateway descriptors), so a first run shows where each budget went.
func writeRenderSummary(w io.Writer, bs *spec.BudgetSet, res *render.Result, o renderOptions, rlsFiles map[string][]byte) error {
	var b strings.Builder
	fmt.Fprintf(&b, "wrote %s: %d files (%d objects and %s)\n", safetext.Inline(o.outDir), len(res.Objects)+1, len(res.Objects), render.KustomizationFile)
	placed := map[int]bool{}
	// Each manifest is parsed once: parsing per Gateway and object took
	// most of a minute for a few hundred Gateways.
	parsed := make([]*renderedObject, len(res.Objects))
	for i, obj := range res.Objects {
		var ro renderedObject
		if err := yaml.Unmarshal(obj.Manifest, &ro); err == nil {
			parsed[i] = &ro
		}
	}
	for _, gw := range bs.Spec.Gateways {
		kind := "Envoy Gateway"
		if gw.IsAgentgateway() {
			kind = "agentgateway"
		}
		fmt.Fprintf(&b, "  Gateway %s/%s (%s):\n", gw.Namespace, gw.Name, kind)
		for i, obj := range res.Objects {
			if line, ok := objectLine(obj, parsed[i], gw); ok {
				placed[i] = true
				fmt.Fprintf(&b, "    %s\n", line)
			}
		}
	}
	for i, obj := range res.Objects {
		if !placed[i] {
			fmt.Fprintf(&b, "  %s %s/%s\n", obj.Kind, obj.Namespace, obj.Name)
		}
	}
	if o.rlsDir != "" {
		fmt.Fprintf(&b, "wrote %s: %d rate limit service config %s (one per domain)\n", safetext.Inline(o.rlsDir), len(rlsFiles), plural(len(rlsFiles), "file", "files"))
	}
	if o.mapPath != "" {
		fmt.Fprintf(&b, "wrote %s: the budget map\n", safetext.Inline(o.mapPath))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// objectLine describes obj when it belongs to Gateway gw: it targets gw, or
// it is gw's GatewayConfig. ro is obj's manifest as the summary reads it (nil
// when it could not be read).
func objectLine(obj render.Object, ro *renderedObject, gw spec.GatewayRef) (string, bool) {
	name := obj.Kind + " " + obj.Namespace + "/" + obj.Name
	if c := gw.GatewayConfig; c != nil && obj.Kind == "GatewayConfig" && obj.Namespace == gw.Namespace && obj.Name == c.Name {
		return name + ": writes the token count for the Gateway's routes", true
	}
	if ro == nil {
		return "", false
	}
	for _, t := range ro.Spec.TargetRefs {
		if t.Kind != "Gateway" || t.Name != gw.Name || ro.Metadata.Namespace != gw.Namespace {
			continue
		}
		switch {
		case len(ro.Spec.RateLimit.Global.Rules) > 0:
			n := len(ro.Spec.RateLimit.Global.Rules)
			return fmt.Sprintf("%s: %d %s%s", name, n, plural(n, "rate limit rule", "rate limit rules"), ro.budgets()), true
		case len(ro.Spec.Traffic.RateLimit.Global.Descriptors) > 0:
			n := len(ro.Spec.Traffic.RateLimit.Global.Descriptors)
			return fmt.Sprintf("%s: %d %s%s", name, n, plural(n, "descriptor", "descriptors"), ro.budgets()), true
		}
		return name, true
	}
	return "", false
}

// budgets names the budgets the object's rules or descriptors hold, in
// order: the rule-budgets annotation of a BackendTrafficPolicy, the budget
// entries of an AgentgatewayPolicy.
func (ro *renderedObject) budgets() string {
	var out []string
	seen := map[string]bool{}
	add := func(b string) {
		if b != "" && !seen[b] {
			seen[b] = true
			out = append(out, b)
		}
	}
	var rbs []struct {
		Budget string `json:"budget"`
	}
	if err := json.Unmarshal([]byte(ro.Metadata.Annotations[render.AnnotationRuleBudgets]), &rbs); err == nil {
		for _, rb := range rbs {
			add(rb.Budget)
		}
	}
	for _, d := range ro.Spec.Traffic.RateLimit.Global.Descriptors {
		for _, e := range d.Entries {
			if e.Name == "budget" {
				add(strings.Trim(e.Expression, `"`))
			}
		}
	}
	if len(out) == 0 {
		return ""
	}
	return " (budgets " + strings.Join(out, ", ") + ")"
}

// warnAgentgatewayBinding warns when agentgateway budgets cannot bind with
// what this run writes: agentgateway never sends caps, so without
// --ratelimit-config the service has no limit for them and answers OK; and a
// budget shared with another Gateway is one bucket only through the budget map.
func warnAgentgatewayBinding(w io.Writer, bs *spec.BudgetSet, o renderOptions) {
	onAgw := map[string]bool{}
	gateways := map[string]map[string]bool{} // budget -> gateways (shared buckets only)
	for _, e := range render.BudgetMap(bs).Entries {
		if e.Gateway.Kind == string(spec.GatewayAgentgateway) {
			onAgw[e.Budget] = true
		}
		if !strings.Contains(e.Bucket, "@") {
			if gateways[e.Budget] == nil {
				gateways[e.Budget] = map[string]bool{}
			}
			gateways[e.Budget][e.Gateway.Namespace+"/"+e.Gateway.Name] = true
		}
	}
	if len(onAgw) == 0 {
		return
	}
	if o.rlsDir == "" {
		_, _ = fmt.Fprintf(w, "budgetgen render: warning: agentgateway budgets %s bind only when the rate limit service has their caps, which agentgateway never sends: render with --ratelimit-config DIR and give the service those files (docs/agentgateway.md); without them the service answers OK and counts nothing\n", names(onAgw)) // a warning, not the output
	}
	shared := map[string]bool{}
	for b := range onAgw {
		if len(gateways[b]) > 1 {
			shared[b] = true
		}
	}
	if o.mapPath == "" && len(shared) > 0 {
		_, _ = fmt.Fprintf(w, "budgetgen render: warning: budgets %s run on an agentgateway Gateway and another Gateway: they are one bucket per principal only with the budget map (--budget-map FILE, given to the service as BUDGET_MAP_PATH); without it each Gateway counts the full cap alone\n", names(shared)) // a warning, not the output
	}
}

func names(set map[string]bool) string {
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}
