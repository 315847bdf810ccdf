package assert

import "strings"

// Metadata keys of rules that charge token units or money rather than
// tokens (pkg/render's KiloTokenMetadataKey and CostMetadataKey; a test keeps
// them equal), written by Envoy AI Gateway in its namespace.
const (
	aiGatewayNamespace   = "io.envoy.ai_gateway"
	kiloTokenMetadataKey = "budgetgen_total_ktokens"
	costMetadataKey      = "budgetgen_cost"
)

// wantUnit is the limit.unit a token rule must have: its annotated window
// (hour, week, month), Day when it has none.
func (r *RateRule) wantUnit() string {
	switch r.Window {
	case "hour", "week", "month":
		return strings.ToUpper(r.Window[:1]) + r.Window[1:]
	}
	return "Day"
}

// wantMetadata is the response metadata a token rule must charge: the token
// source, or the AI Gateway key of its annotated measure.
func (r *RateRule) wantMetadata(ns, key string) (string, string) {
	switch r.Measure {
	case "ktokens":
		return aiGatewayNamespace, kiloTokenMetadataKey
	case "cost":
		return aiGatewayNamespace, costMetadataKey
	}
	return ns, key
}
