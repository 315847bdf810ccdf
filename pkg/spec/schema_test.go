package spec

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
)

const schemaFile = "../../schema/budgetset.schema.json"

// TestSchemaUpToDate fails when the committed JSON Schema is not what the Go
// types generate today. Fix with: go generate ./pkg/spec
func TestSchemaUpToDate(t *testing.T) {
	want, err := JSONSchema("types.go")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatalf("%v (run go generate ./pkg/spec)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run go generate ./pkg/spec", schemaFile)
	}
	again, _ := JSONSchema("types.go")
	if !bytes.Equal(want, again) {
		t.Fatal("schema generation is not deterministic")
	}
}

// TestSchemaShape checks the schema describes what Load accepts: closed
// objects, the required fields, the enum of modes.
func TestSchemaShape(t *testing.T) {
	data, err := JSONSchema("")
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Required             []string `json:"required"`
		AdditionalProperties *bool    `json:"additionalProperties"`
		Defs                 map[string]struct {
			Required             []string `json:"required"`
			AdditionalProperties *bool    `json:"additionalProperties"`
			Properties           map[string]struct {
				Enum []string `json:"enum"`
			} `json:"properties"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	if s.AdditionalProperties == nil || *s.AdditionalProperties {
		t.Error("top level accepts unknown fields")
	}
	if len(s.Required) != 4 {
		t.Errorf("top-level required = %v", s.Required)
	}
	b, ok := s.Defs["Budget"]
	if !ok {
		t.Fatal("no Budget definition")
	}
	if b.AdditionalProperties == nil || *b.AdditionalProperties {
		t.Error("Budget accepts unknown fields")
	}
	if got := b.Properties["mode"].Enum; len(got) != 2 || got[0] != "shadow" || got[1] != "enforce" {
		t.Errorf("Budget.mode enum = %v", got)
	}
	if _, ok := b.Properties["shadowSince"]; !ok {
		t.Error("embedded Rollout fields are not inlined into Budget")
	}
}
