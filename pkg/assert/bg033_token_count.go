package assert

import (
	"fmt"
	"slices"
	"strings"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/internal/aigateway"
	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// ruleTokenCount: BG003 and BG013 check that a budget charges the token key
// and that Envoy AI Gateway writes it; this rule checks what the key holds.
// An llmRequestCosts entry decides it (route entry first, else the Gateway's
// GatewayConfig: AI Gateway's GatewayConfigSpec): type InputToken or
// OutputToken under llm_total_token charges part of each response, a CEL
// cost without output tokens charges nothing for what a model writes, and a
// CEL expression the AI Gateway controller cannot compile (in the variables
// of internal/llmcostcel/cel.go, v1.1.0) is refused. On agentgateway, a
// Tokens descriptor's cost expression replaces the default total token count
// (crates/agentgateway/src/http/remoteratelimit.rs, DescriptorEntry.cost):
// one that reads only llm.inputTokens or llm.outputTokens charges part.
var ruleTokenCount = &Rule{
	ID:       "BG033",
	Name:     "token-count",
	Doc:      "the metadata a budget charges counts every token (AI Gateway cost type TotalToken, or CEL over input and output tokens; a money CEL with output tokens; an agentgateway cost expression over all tokens)",
	Severity: Error,
	Check: func(p *Pass) error {
		reported := map[*manifest.Object]map[string]bool{}
		for _, pol := range p.Index.BudgetPolicies() {
			keys := chargedKeys(pol)
			if len(keys) == 0 {
				continue
			}
			for _, t := range p.Index.Targets(pol.Obj) {
				checkGatewayCosts(p, pol.Obj, GatewayKey{Namespace: t.Gateway.Namespace, Name: t.Gateway.Name}, keys, reported)
			}
		}
		checkAgentgatewayCosts(p)
		return nil
	},
}

// chargedKeys maps each AI Gateway metadata key a budget policy's token
// rules charge to its measure ("" tokens, "ktokens", "cost").
func chargedKeys(pol *Policy) map[string]string {
	out := map[string]string{}
	for _, r := range pol.Rules {
		md := manifest.Get(r.Node, "cost", "response", "metadata")
		if r.Kind != TokenRule || manifest.Str(manifest.Get(md, "namespace")) != aigateway.MetadataNamespace {
			continue
		}
		key := manifest.Str(manifest.Get(md, "key"))
		switch {
		case r.Measure != "":
			out[key] = r.Measure
		case key == kiloTokenMetadataKey:
			out[key] = "ktokens"
		case key == costMetadataKey:
			out[key] = "cost"
		default:
			out[key] = ""
		}
	}
	return out
}

// checkGatewayCosts checks the cost entries that write keys for the routes
// of Gateway gk: each route's own entry, else its GatewayConfig's.
func checkGatewayCosts(p *Pass, pol *manifest.Object, gk GatewayKey, keys map[string]string, reported map[*manifest.Object]map[string]bool) {
	gc := gatewayConfigOf(p.Index, gk)
	check := func(owner *manifest.Object, c *aigateway.Cost, measure string) {
		if c == nil {
			return
		}
		if reported[owner] == nil {
			reported[owner] = map[string]bool{}
		}
		if reported[owner][c.Key] {
			return
		}
		reported[owner][c.Key] = true
		path := "spec.llmRequestCosts"
		if owner.Kind == aigateway.KindGatewayConfig {
			path = "spec.globalLLMRequestCosts"
		}
		if msg := costEntryError(c, measure); msg != "" {
			p.Report(owner, c.Node, path, "llmRequestCosts entry %s: %s, and %s charges it as %s; %s",
				c.Key, msg, pol, measureName(measure), costFix(c.Key, measure))
		}
	}
	for _, km := range sortedKeys(keys) {
		if gc != nil {
			check(gc.Obj, gc.Cost(km[0]), km[1])
		}
	}
	for _, rt := range p.Index.aiRoutes {
		if !slices.ContainsFunc(rt.Parents, func(pr aigateway.ParentRef) bool { return pr.Namespace == gk.Namespace && pr.Name == gk.Name }) {
			continue
		}
		for _, km := range sortedKeys(keys) {
			check(rt.Obj, rt.Cost(km[0]), km[1])
		}
	}
}

// sortedKeys lists keys as (key, measure) pairs in key order.
func sortedKeys(keys map[string]string) [][2]string {
	out := make([][2]string, 0, len(keys))
	for k, m := range keys {
		out = append(out, [2]string{k, m})
	}
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return out
}

// gatewayConfigOf is the GatewayConfig of the input a Gateway of the input
// references (annotation aigateway.envoyproxy.io/gateway-config), or nil.
func gatewayConfigOf(ix *Index, gk GatewayKey) *aigateway.GatewayConfig {
	gw := ix.gatewayObject(gk)
	if gw == nil {
		return nil
	}
	name := aigateway.GatewayConfigName(gw)
	for _, gc := range ix.aiConfigs {
		if name != "" && gc.Obj.Namespace == gk.Namespace && gc.Obj.Name == name {
			return gc
		}
	}
	return nil
}

// costEntryError says what is wrong with an entry for a key charged as
// measure ("" tokens, "ktokens", "cost"); "" when nothing is.
func costEntryError(c *aigateway.Cost, measure string) string {
	var vars []string
	if c.Type == aigateway.CostCEL {
		var err error
		if vars, err = aigateway.CostVariables(c.CEL); err != nil {
			return fmt.Sprintf("the CEL expression %s (the AI Gateway controller refuses it, llmcostcel.NewProgram)", err)
		}
	}
	has := func(v string) bool { return slices.Contains(vars, v) }
	total := has(aigateway.CELTotalTokens)
	switch {
	case measure == "cost" && c.Type != aigateway.CostCEL:
		return fmt.Sprintf("type %s writes a token count, not a cost", c.Type)
	case measure == "cost" && !total && !has(aigateway.CELOutputTokens):
		return "the CEL cost does not read output_tokens (nor total_tokens): what the model writes costs nothing"
	case measure == "cost" && !total && !has(aigateway.CELInputTokens):
		return "the CEL cost does not read input_tokens (nor total_tokens): prompts cost nothing"
	case measure == "cost", c.Type == aigateway.CostTotalToken:
		return ""
	case c.Type != aigateway.CostCEL:
		return fmt.Sprintf("type %s writes only part of each response's tokens", c.Type)
	case !total && (!has(aigateway.CELInputTokens) || !has(aigateway.CELOutputTokens)):
		return fmt.Sprintf("the CEL expression reads %v, not total_tokens nor both input_tokens and output_tokens: it counts part of each response's tokens", vars)
	}
	return ""
}

func measureName(m string) string {
	switch m {
	case "ktokens":
		return "thousands of tokens"
	case "cost":
		return "money"
	}
	return "tokens"
}

func costFix(key, measure string) string {
	switch measure {
	case "cost", "ktokens":
		return "render again and use the entry budgetgen prints (render's note, annotation " + "budgetgen.dev/llm-request-costs)"
	}
	return fmt.Sprintf("use {metadataKey: %s, type: TotalToken}", key)
}

// checkAgentgatewayCosts reports Tokens descriptors of agentgateway budget
// policies whose cost expression reads only part of the tokens.
func checkAgentgatewayCosts(p *Pass) {
	for _, o := range agentgatewayBudgetPolicies(p.Index) {
		for i, d := range manifest.Items(manifest.Get(o.Node, "spec", "traffic", "rateLimit", "global", "descriptors")) {
			cost := manifest.Get(d, "cost")
			if cost == nil || manifest.Str(manifest.Get(d, "unit")) != agentgateway.UnitTokens {
				continue
			}
			fields, err := agentgateway.LLMFields(manifest.Str(cost))
			if err != nil {
				continue // BG020 reports what does not parse
			}
			has := func(f string) bool { return slices.Contains(fields, f) }
			if has(agentgateway.LLMTotalTokens) || has(agentgateway.LLMInputTokens) && has(agentgateway.LLMOutputTokens) {
				continue
			}
			path := fmt.Sprintf("%s.descriptors[%d].cost", agwGlobalPath, i)
			p.Report(o, cost, path, "%s: a Tokens descriptor's cost expression replaces the total token count agentgateway charges by default (remoteratelimit.rs), and this one reads llm fields %v, not llm.totalTokens nor both llm.inputTokens and llm.outputTokens: it charges part of each response; use the cost render writes, %q (the whole count, 1 for a usage of 0 so that a reserving budget's amend settles its hold)", path, fields, agentgateway.CostTotalTokens)
		}
	}
}
