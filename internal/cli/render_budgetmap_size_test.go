package cli

import (
	"bytes"
	"strings"
	"testing"
)

// A budget map over what a ConfigMap holds is written, with a warning that
// the documented deployment (the ConfigMap budgetgen-budget-map) will be
// refused; one that fits says nothing.
func TestBudgetMapSizeWarning(t *testing.T) {
	for _, c := range []struct {
		size int
		warn bool
	}{{configMapMaxBytes, false}, {configMapMaxBytes + 1, true}, {0, false}} {
		var stderr bytes.Buffer
		warnBudgetMapSize(&env{stderr: &stderr}, "maps/budget-map.yaml", make([]byte, c.size))
		got := stderr.String()
		if warned := strings.Contains(got, "warning: the budget map maps/budget-map.yaml is") && strings.Contains(got, "budgetgen-budget-map"); warned != c.warn {
			t.Errorf("%d bytes: warned %v, want %v: %q", c.size, warned, c.warn, got)
		}
	}
}
