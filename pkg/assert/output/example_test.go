package output_test

import (
	"fmt"
	"os"

	"github.com/budgetgen/budgetgen/pkg/assert"
	"github.com/budgetgen/budgetgen/pkg/assert/output"
)

// A CI job writes the gate's findings in the format its system reads; the
// github format turns each into an annotation on the pull request's file.
func Example() {
	findings := []assert.Finding{{
		Rule: "BG001", Severity: assert.Error, File: "manifests/policies.yaml", Line: 16, Column: 11,
		Path:    "spec.rateLimit.global.rules[0].shared",
		Object:  "BackendTrafficPolicy ai-gateway/ai-budgets-ai-gateway",
		Message: "token rule 0 has no shared: true",
	}}
	w, err := output.New(output.GitHub, os.Stdout, output.Meta{Rules: []*assert.Rule{assert.Lookup("BG001")}, Objects: 2, Files: []string{"manifests/policies.yaml"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := output.WriteAll(w, findings); err != nil {
		fmt.Println(err)
	}
	_, err = output.New("xml", os.Stdout, output.Meta{})
	fmt.Println(err)
	// Output:
	// ::error file=manifests/policies.yaml,line=16,col=11,title=BG001 shared::token rule 0 has no shared: true (BackendTrafficPolicy ai-gateway/ai-budgets-ai-gateway)
	// ::notice title=budgetgen assert::budgetgen assert: FAIL: 1 error, 0 warnings in 2 objects from 1 file, 1 rule%0ABG001 shared: 1 finding
	// unknown output format "xml" (want one of text, json, github, junit, sarif)
}
