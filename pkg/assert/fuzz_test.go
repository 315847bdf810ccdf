package assert

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/manifest"
)

// FuzzAssert runs every rule but BG007 over arbitrary manifests (seeded with
// every rule fixture): whatever
// the reader accepts, the rules must not panic and every finding must name
// a rule and a file.
func FuzzAssert(f *testing.F) {
	paths, _ := filepath.Glob("testdata/rules/*.yaml")
	for _, p := range paths {
		if data, err := os.ReadFile(p); err == nil && len(data) < 8<<10 {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := manifest.Parse("fuzz.yaml", data, manifest.Options{MaxNodes: 20_000})
		if err != nil {
			return
		}
		rep, err := Run(context.Background(), objs, Options{
			EnvoyGatewayVersion: "v1.8.0",
			AllowEnforce:        []string{"x"},
			Spec:                &SpecFacts{File: "spec.yaml", Enforced: map[string]bool{"per-api-key": true, "per-run": true}},
			Rendered:            objs[:len(objs)/2],
		})
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		for _, fd := range rep.Findings {
			if fd.Rule == "" || fd.File == "" || fd.Message == "" {
				t.Fatalf("incomplete finding %+v", fd)
			}
		}
	})
}
