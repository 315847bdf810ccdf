package render

import (
	"testing"

	"github.com/budgetgen/budgetgen/internal/agentgateway"
	"github.com/budgetgen/budgetgen/internal/aigateway"
)

// TestOwnModelKinds: the public kind constants name what the models render
// writes, which stay private (Object.Object is unstructured for them).
func TestOwnModelKinds(t *testing.T) {
	if KindAgentgatewayPolicy != agentgateway.KindPolicy {
		t.Errorf("KindAgentgatewayPolicy %q, the model writes %q", KindAgentgatewayPolicy, agentgateway.KindPolicy)
	}
	if KindGatewayConfig != aigateway.KindGatewayConfig {
		t.Errorf("KindGatewayConfig %q, the model writes %q", KindGatewayConfig, aigateway.KindGatewayConfig)
	}
}
