package yamlpos_test

import (
	"fmt"

	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// A loader reads its one document, decodes it, and checks what it means by
// field path, positioned with the decoder's Positions.
func Example() {
	type limit struct {
		Name     string `yaml:"name"`
		Requests uint32 `yaml:"requests"`
	}
	type file struct {
		Limits []limit `yaml:"limits"`
	}
	src := []byte("limits:\n  - name: a\n    requests: 10\n  - name: b\n    requests: -1\n  - nmae: c\n")
	opts := yamlpos.Options{File: "limits.yaml", Tag: "yaml"}
	root, err := yamlpos.One(src, opts, "limit list", "limits file")
	if err != nil {
		fmt.Println(err)
		return
	}
	var f file
	pos, errs := yamlpos.Decode(root, &f, opts)
	for i, l := range f.Limits {
		if l.Name == "" {
			path := fmt.Sprintf("limits[%d].name", i)
			at := pos.Of(path) // absent: where its limit is
			errs = append(errs, &yamlpos.Error{File: opts.File, Line: at.Line, Column: at.Column, Path: path, Msg: "is required"})
		}
	}
	fmt.Println(errs.Err())
	// Output:
	// limits.yaml:5:15: limits[1].requests: must be an integer between 0 and 4294967295, got "-1"
	// limits.yaml:6:5: limits[2].name: is required
	// limits.yaml:6:5: limits[2].nmae: unknown field, did you mean name? (known: name, requests)
}
