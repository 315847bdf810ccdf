package spec

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"

	"github.com/invopop/jsonschema"
)

//go:generate go run ../../internal/schemagen -types types.go -o ../../schema/budgetset.schema.json

// SchemaID is the published address of the BudgetSet JSON Schema, used by the
// yaml-language-server comment in the starter templates.
const SchemaID = "https://raw.githubusercontent.com/budgetgen/budgetgen/main/schema/budgetset.schema.json"

// JSONSchema generates the BudgetSet JSON Schema from the Go types, so it can
// never drift from what Load accepts. typesFile, when not empty, is the path
// of this package's types.go relative to the working directory of a process
// running inside pkg/spec (go generate, go test); its doc comments become
// the schema's descriptions.
func JSONSchema(typesFile string) ([]byte, error) {
	r := &jsonschema.Reflector{ExpandedStruct: true}
	if typesFile != "" {
		base := reflect.TypeOf(BudgetSet{}).PkgPath()
		// The types live in types.go and, for windows and money, its
		// siblings limits.go and pricing.go, for reservations reserve.go.
		dir := filepath.Dir(typesFile)
		for _, f := range []string{typesFile, filepath.Join(dir, "limits.go"), filepath.Join(dir, "pricing.go"), filepath.Join(dir, "reserve.go")} {
			if err := r.AddGoComments(base, f); err != nil {
				return nil, fmt.Errorf("read comments from %s: %w", f, err)
			}
		}
	}
	s := r.Reflect(&BudgetSet{})
	s.ID = SchemaID
	s.Title = "budgetgen BudgetSet (" + APIVersion + ")"
	out, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode schema: %w", err)
	}
	return append(out, '\n'), nil
}
