package budgetmap

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/budgetgen/budgetgen/pkg/yamlpos"
)

// FuzzLoad: any input either loads, and then encodes to a file that loads
// back to the same map, or fails with an error naming the file; never a
// panic. In package budgetmap (no render import) so the fuzz build stays small.
func FuzzLoad(f *testing.F) {
	golden, err := os.ReadFile("testdata/mixed-map.golden.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(golden)
	f.Add([]byte("apiVersion: budgetgen.dev/v1alpha1\nkind: BudgetMap\nbudgetSet: s\nentries: []\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Add([]byte("entries: [{descriptor: 1}]"))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("apiVersion: budgetgen.dev/v1alpha1\nkind: BudgetMap\nentries: [{reserve: {auto: yes}, tokensPerDay: 1e3, windw: day}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Load(data, "f.yaml")
		if err != nil {
			if m != nil {
				t.Fatal("map returned with an error")
			}
			var e *yamlpos.Error
			if !strings.HasPrefix(err.Error(), "f.yaml") || !errors.As(err, &e) || e.File != "f.yaml" {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		enc, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := Load(enc, "f.yaml")
		if err != nil {
			t.Fatalf("re-encoded map does not load: %v\n%s", err, enc)
		}
		m.Sort()
		if len(m.Entries) == 0 {
			m.Entries, m2.Entries = nil, nil
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip changed the map:\n%+v\n%+v", m, m2)
		}
	})
}
