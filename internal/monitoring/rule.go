package monitoring

import (
	"bytes"
	"fmt"

	"gopkg.in/yaml.v3"
)

// PrometheusRuleName is the PrometheusRule's metadata.name.
const PrometheusRuleName = "budgetgen-ratelimit"

// prometheusRuleHead says where the generated file comes from.
const prometheusRuleHead = `# Code generated from ratelimit.rules.yaml by go test ./deploy/monitoring -update. DO NOT EDIT.
# The alert rules of budgetgen's rate limit service for the Prometheus Operator
# (docs/monitoring.md; each alert's runbook is in docs/runbook.md). Add the labels
# your Prometheus' ruleSelector expects (kube-prometheus-stack: release: <name>).
`

// PrometheusRule wraps a Prometheus rule file's groups (rules, named file
// in errors) in a monitoring.coreos.com/v1 PrometheusRule, comments kept.
func PrometheusRule(rules []byte, file string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(rules, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: want a mapping with groups", file)
	}
	var groups *yaml.Node
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		if k := root.Content[i]; k.Value == "groups" {
			groups = root.Content[i+1]
		} else {
			return nil, fmt.Errorf("%s:%d: %s: only groups belongs in a rule file", file, k.Line, k.Value)
		}
	}
	if groups == nil || groups.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("%s: groups: want a list", file)
	}
	str := func(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v} }
	mapping := func(kv ...*yaml.Node) *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode, Content: kv} }
	out := mapping(
		str("apiVersion"), str("monitoring.coreos.com/v1"),
		str("kind"), str("PrometheusRule"),
		str("metadata"), mapping(str("name"), str(PrometheusRuleName),
			str("labels"), mapping(str("app.kubernetes.io/name"), str("budgetgen-ratelimit"), str("app.kubernetes.io/component"), str("monitoring"))),
		str("spec"), mapping(str("groups"), groups),
	)
	var b bytes.Buffer
	b.WriteString(prometheusRuleHead)
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(out); err != nil {
		return nil, fmt.Errorf("prometheusrule: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("prometheusrule: %w", err)
	}
	return b.Bytes(), nil
}
