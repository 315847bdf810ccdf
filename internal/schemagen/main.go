// Command schemagen writes the BudgetSet JSON Schema generated from pkg/spec's
// Go types. It runs from pkg/spec through `go generate ./pkg/spec`.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/budgetgen/budgetgen/internal/atomicfile"
	"github.com/budgetgen/budgetgen/pkg/spec"
)

func main() {
	types := flag.String("types", "types.go", "path of pkg/spec/types.go, for field descriptions")
	out := flag.String("o", "", "output file (required)")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "schemagen: -o is required")
		os.Exit(2)
	}
	data, err := spec.JSONSchema(*types)
	if err == nil {
		err = atomicfile.WriteFile(*out, data, atomicfile.Options{})
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "schemagen: %v\n", err)
		os.Exit(1)
	}
}
