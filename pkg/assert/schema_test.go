package assert_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/assert"
	"github.com/budgetgen/budgetgen/pkg/assert/crd"
)

// TestMain gives the fixture tests Envoy Gateway's own CRDs (schema and CEL,
// through internal/crdvalidate), so every fixture is also checked by BG007 and the
// bg007_* fixtures fail for exactly their schema violations.
func TestMain(m *testing.M) {
	v, err := crd.Validator()
	if err != nil {
		fmt.Fprintln(os.Stderr, "build CRD validator:", err)
		os.Exit(1)
	}
	assert.SetFixtureValidator(v)
	os.Exit(m.Run())
}
